"""One settings model per program (qbroker.settings): flags, environment and a TOML file fill the same fields.

The models are the programs' own (toposm-queuemaster's, qbroker-dead-letter's); nothing here needs a broker.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from qbroker.cli.dead_letter import DeadLetterSettings
from qbroker.exit_codes import ExitCode
from qbroker.settings import ProgramSettings
from services.tiles.queuemaster.main import QueuemasterOptions

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith(("QBROKER_", "TOPOSM_")):
            monkeypatch.delenv(name)


def test_flag_beats_environment_beats_file_beats_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "queuemaster.toml"
    config.write_text(
        'min_zoom = 3\nmax_zoom = 15\nping_misses = 7\nurl = "amqp://from-file/"\nrenderer_users = ["r1", "r2"]\n'
    )
    monkeypatch.setenv("TOPOSM_CONFIG", str(config))
    monkeypatch.setenv("TOPOSM_MAX_ZOOM", "16")
    monkeypatch.setenv("TOPOSM_MIN_ZOOM", "4")
    monkeypatch.setenv("TOPOSM_EXPIRE_USERS", "e1, e2")
    options = QueuemasterOptions.parse(["--min-zoom", "5"])
    assert (options.min_zoom, options.max_zoom, options.ping_misses) == (5, 16, 7)
    assert options.url == "amqp://from-file/" and options.ping_interval == 1.0
    policy = options.queuemaster_settings().access
    assert policy.renderers == {"r1", "r2"} and policy.expirers == {"e1", "e2"} and policy.bulk is None


def test_the_shared_options_reach_the_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QBROKER_EXCHANGE_PREFIX", "env.")
    settings = DeadLetterSettings.parse(
        ["--url", "amqp://a/,amqp://b/", "--drain-timeout", "3", "--hear", "toposm", "--hear", "other"]
    )
    config = settings.unit_config(dead_letters=True)
    assert config.urls == ["amqp://a/", "amqp://b/"] and config.exchange_prefix == "env."
    assert config.drain_timeout == 3 and config.dead_letters and settings.hear == ["toposm", "other"]
    assert QueuemasterOptions.parse([]).drain_timeout == 5.0  # a program's own default of a shared option


@pytest.mark.parametrize(
    "argv, env, problem",
    [
        (["--min-zoom", "x"], {}, "--min-zoom"),
        ([], {"TOPOSM_MAX_ZOOM": "99"}, "--max-zoom (env TOPOSM_MAX_ZOOM)"),
        ([], {"QBROKER_METRICS_PORT": "70000"}, "--metrics-port (env QBROKER_METRICS_PORT)"),
        (["--min-zoom", "9", "--max-zoom", "3"], {}, "--min-zoom 9 is above --max-zoom 3"),
        (["--tile-store", "meta", "--max-zoom", "25"], {}, "--tile-store meta holds zooms up to 20"),
        (["--config", "/no/such/file.toml"], {}, "--config /no/such/file.toml"),
    ],
)
def test_every_mistake_is_a_usage_error_naming_the_option(
    argv: list[str],
    env: dict[str, str],
    problem: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_:
        QueuemasterOptions.parse(argv)
    assert exit_.value.code == ExitCode.USAGE
    assert problem in capsys.readouterr().err


def test_an_unknown_key_in_the_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "qm.toml"
    config.write_text("min_zom = 3\n")
    with pytest.raises(SystemExit) as exit_:
        QueuemasterOptions.parse(["--config", str(config)])
    assert exit_.value.code == ExitCode.USAGE and "unknown setting 'min_zom'" in capsys.readouterr().err


def test_help_shows_each_options_default_and_environment_variable_never_a_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # one option a line
    monkeypatch.setenv("QBROKER_URL", "amqp://operator:s3cret@broker/")
    with pytest.raises(SystemExit) as exit_:
        QueuemasterOptions.parse(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "s3cret" not in text and "guest:guest" not in text
    entries = [" ".join(entry.split()) for entry in re.split(r"\n(?=  -)", text.split("options:", 1)[1])]
    options = [entry for entry in entries if entry.startswith("--") and not entry.startswith("--version")]
    assert len(options) == len(QueuemasterOptions.model_fields)
    for entry in options:
        assert re.search(r"env: (QBROKER|TOPOSM)_[A-Z_]+\]$", entry), entry
    assert "--max-zoom Z" in text and "[default: 18; env: TOPOSM_MAX_ZOOM]" in text
    assert "[default: amqp://guest:***@127.0.0.1:5672/; env: QBROKER_URL]" in text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from qbroker import __version__

    with pytest.raises(SystemExit) as exit_:
        DeadLetterSettings.parse(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"qbroker-dead-letter {__version__}"


def test_the_shared_options_are_every_programs() -> None:
    shared = {
        "url",
        "exchange_prefix",
        "metrics_port",
        "metrics_host",
        "drain_timeout",
        "log_format",
        "log_level",
        "config",
    }
    assert set(ProgramSettings.model_fields) == shared
    for model in (QueuemasterOptions, DeadLetterSettings):
        assert shared <= set(model.model_fields)


def test_the_exit_code_table_in_the_docs_is_the_librarys() -> None:
    text = (ROOT / "docs" / "cli.md").read_text()
    table = text[text.index("## Exit codes") :]
    rows = {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d+) \| `(\w+)` \|", table, re.M)}
    assert rows == {int(code): code.name for code in ExitCode}
