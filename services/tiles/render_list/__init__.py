"""``toposm-render-list``: pre-render every metatile of an area at bulk priority (renderd's render_list)."""
