"""One settings model per program: flags, environment and an optional TOML file read into the same fields.

A program's settings are a pydantic-settings model (``ProgramSettings`` or a subclass). Each field is one
option: ``--min-zoom`` on the command line, ``TOPOSM_MIN_ZOOM`` in the environment (the model's prefix, or
the names in ``option(env=...)``), ``min_zoom`` in the file given with ``--config`` (or ``<PREFIX>CONFIG``).
The command line wins over the environment, which wins over the file, which wins over the default. The
command line is generated from the fields (``parse``), so an option's help shows its default and its
environment variable, and every mistake (a bad flag, a bad value from any of the three) exits 64 with the
option named (docs/cli.md). Why not pydantic-settings' own CLI source: docs/decisions.md.

``ProgramSettings`` holds the options every program shares (broker, metrics, drain, logging, ``--version``).
"""

from __future__ import annotations

import argparse
import contextvars
import importlib.util
import logging
import os
import sys
import tomllib
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, NoReturn, Self, Union, get_args, get_origin

from pydantic import AliasChoices, BeforeValidator, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic.json_schema import JsonDict
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from qbroker import __version__
from qbroker.config import Config, redact_url
from qbroker.exit_codes import ExitCode


def _comma_separated(value: Any) -> Any:
    if isinstance(value, str):
        return frozenset(u.strip() for u in value.split(",") if u.strip())
    return value


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


def _upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


LogFormat = Annotated[Literal["console", "json"], BeforeValidator(_lower)]
LogLevel = Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], BeforeValidator(_upper)]
# Broker accounts, comma-separated on the command line and in the environment; a list in the TOML file.
UserList = Annotated[frozenset[str], NoDecode, BeforeValidator(_comma_separated)]


def option(
    default: Any = ...,
    help: str = "",
    *,
    env: str | Sequence[str] | None = None,  # noqa: A002
    metavar: str | None = None,
    positional: bool = False,
    repeat: bool = False,
    group: str | None = None,
    default_text: str | None = None,
    flag: str | None = None,
    **constraints: Any,
) -> Any:
    """A settings field and its option. ``env``: its environment variable(s) when not the model's prefix + NAME;
    ``repeat``: a list given by repeating the flag; ``default_text``: the default as help shows it; ``flag``: the
    option's name when not the field's (a field cannot be called ``json``: pydantic's own)."""
    given = (
        ("metavar", metavar),
        ("positional", positional or None),
        ("repeat", repeat or None),
        ("group", group),
        ("default_text", default_text),
        ("flag", flag),
    )
    extra: JsonDict = {k: v for k, v in given if v is not None}
    names = [env] if isinstance(env, str) else list(env or ())
    alias = AliasChoices(*names) if names else None
    return Field(default, description=help, validation_alias=alias, json_schema_extra=extra or None, **constraints)


def shared(settings: type[BaseSettings], name: str, default: Any) -> Any:
    """``settings``' option ``name`` with another default (a program's own drain timeout, zoom range...)."""
    return FieldInfo.merge_field_infos(settings.model_fields[name], default=default)


_TOML_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar("settings_toml_file", default=None)


class UsageParser(argparse.ArgumentParser):
    """argparse whose usage errors exit 64 (EX_USAGE), not 2: 2 is a remote ``fail`` (qbroker.exit_codes)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(int(ExitCode.USAGE), f"{self.prog}: error: {message}\n")


class ProgramSettings(BaseSettings):
    """The options every program shares. A program subclasses it with its own fields and ``prog``."""

    model_config = SettingsConfigDict(
        env_prefix="QBROKER_", populate_by_name=True, extra="forbid", validate_default=False
    )
    prog: ClassVar[str] = "qbroker-program"
    version: ClassVar[str] = __version__  # what --version reports: the program's own distribution's
    description: ClassVar[str | None] = None
    epilog: ClassVar[str | None] = None

    config: Path | None = option(
        None, "read settings from this TOML file (keys: the options' names with _)", metavar="FILE"
    )
    url: str | None = option(
        None,
        "broker URL, or several comma-separated for failover (tried in order); "
        "the password better in QBROKER_PASSWORD_FILE",
        env="QBROKER_URL",
        default_text=redact_url(Config.model_fields["url"].default),
    )
    exchange_prefix: str | None = option(
        None, "prefix of every exchange and shared queue name", env="QBROKER_EXCHANGE_PREFIX", default_text="''"
    )
    metrics_port: int | None = option(
        None,
        "serve Prometheus metrics on this port (0: any free port)",
        env="QBROKER_METRICS_PORT",
        metavar="PORT",
        default_text="no metrics server",
        ge=0,
        le=65535,
    )
    metrics_host: str = option("127.0.0.1", "address of the metrics server", env="QBROKER_METRICS_HOST", metavar="HOST")
    drain_timeout: float = option(
        10.0,
        "on SIGTERM, seconds to finish the work in hand before stopping",
        env="QBROKER_DRAIN_TIMEOUT",
        metavar="SECONDS",
        ge=0,
    )
    log_format: LogFormat = option(
        "console", "log lines for people, or one JSON object a line", env="QBROKER_LOG_FORMAT"
    )
    log_level: LogLevel = option("INFO", "lowest level logged", env="QBROKER_LOG_LEVEL")

    @model_validator(mode="after")
    def _metrics_servable(self) -> Self:
        if self.metrics_port is not None and importlib.util.find_spec("prometheus_client") is None:
            raise ValueError("--metrics-port needs prometheus-client: pip install 'qbroker-amqp[metrics]'")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = _TOML_FILE.get()
        sources: tuple[PydanticBaseSettingsSource, ...] = (init_settings, env_settings)
        if toml_file is not None:
            sources += (TomlConfigSettingsSource(settings_cls, toml_file=toml_file),)
        return sources

    # -- the command line --------------------------------------------------------------------------------------

    @classmethod
    def parser(cls) -> UsageParser:
        p = UsageParser(
            prog=cls.prog,
            description=cls.description,
            epilog=cls.epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("--version", action="version", version=f"{cls.prog} {cls.version}")
        groups: dict[str, argparse._ArgumentGroup] = {}
        for name, field in cls.model_fields.items():
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            group_name = extra.get("group")
            if group_name and str(group_name) not in groups:
                groups[str(group_name)] = p.add_argument_group(str(group_name))
            target: Any = groups[str(group_name)] if group_name else p
            _add_option(target, cls, name, field, extra)
        return p

    @classmethod
    def parse(cls, argv: Sequence[str] | None = None) -> Self:
        """The settings from ``argv`` (default: ``sys.argv``), the environment and ``--config``; a mistake in
        any of them prints the usage and exits 64."""
        p = cls.parser()
        given = {k: v for k, v in vars(p.parse_args(argv)).items() if v is not None}
        return cls.from_values(given, p)

    @classmethod
    def from_values(cls, given: dict[str, Any], p: UsageParser | None = None) -> Self:
        p = p or cls.parser()
        toml_file = given.get("config") or cls._config_from_env()
        if toml_file is not None:
            try:
                with open(toml_file, "rb") as f:
                    tomllib.load(f)
            except (OSError, tomllib.TOMLDecodeError) as exc:
                p.error(f"--config {toml_file}: {getattr(exc, 'strerror', None) or exc}")
        token = _TOML_FILE.set(Path(toml_file) if toml_file is not None else None)
        try:
            return cls(**given)
        except ValidationError as exc:
            p.error(cls._describe(exc, toml_file))
        finally:
            _TOML_FILE.reset(token)

    @classmethod
    def _config_from_env(cls) -> str | None:
        return os.environ.get(f"{cls.model_config.get('env_prefix', '')}CONFIG") or None

    @classmethod
    def _describe(cls, exc: ValidationError, toml_file: Any) -> str:
        """One line per problem, each naming the option (never echoing the value: it may be a password)."""
        aliases = {alias: name for name, field in cls.model_fields.items() for alias in _env_names(cls, name, field)}
        problems = []
        for error in exc.errors():
            loc = str(error["loc"][0]) if error["loc"] else ""
            name = aliases.get(loc, loc)
            msg = error["msg"].removeprefix("Value error, ")
            if error["type"] == "extra_forbidden":
                problems.append(f"{toml_file}: unknown setting {loc!r}")
            elif name in cls.model_fields:
                field = cls.model_fields[name]
                problems.append(f"{_flag_of(name, field)} (env {_env_names(cls, name, field)[0]}): {msg}")
            else:
                problems.append(msg)
        return "; ".join(problems)

    # -- what every program does with them ------------------------------------------------------------------------

    def unit_config(self, **overrides: Any) -> Config:
        """The unit's ``Config``: QBROKER_* as always, with what these settings say on top."""
        values: dict[str, Any] = {"drain_timeout": self.drain_timeout}
        if self.url is not None:
            values["url"] = self.url
        if self.exchange_prefix is not None:
            values["exchange_prefix"] = self.exchange_prefix
        return Config(**{**values, **overrides})

    def configure_logging(self) -> None:
        from qbroker.log import configure_logging

        drop_repeated_connect_errors()
        # json=None: the library's own reading of the environment (QBROKER_LOG_JSON too) decides
        configure_logging(self.log_level, json=True if self.log_format == "json" else None)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _flag_of(name: str, field: FieldInfo) -> str:
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if extra.get("positional"):
        return str(extra.get("metavar") or name.upper())
    return str(extra.get("flag") or _flag(name))


def _env_names(cls: type[BaseSettings], name: str, field: FieldInfo) -> list[str]:
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [str(a) for a in alias.choices]
    if isinstance(alias, str):
        return [alias]
    return [f"{cls.model_config.get('env_prefix', '')}{name}".upper()]


def _plain_type(annotation: Any) -> tuple[Any, bool]:
    """The type an option's value converts to, and whether the field is a list (``X | None`` -> ``X``)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _plain_type(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return _plain_type(args[0]) if len(args) == 1 else (str, False)
    if origin in (list, frozenset, set):
        return _plain_type(get_args(annotation)[0])[0], True
    if origin is tuple:  # given as one word its validator reads (ZOOM:SECONDS)
        return str, False
    return annotation, False


def _shown_default(field: FieldInfo, extra: dict[str, Any]) -> str | None:
    if "default_text" in extra:
        return str(extra["default_text"])
    default = field.get_default(call_default_factory=True)
    if default is None or default == () or default == frozenset() or default == []:
        return None
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, str) and "://" in default:
        return redact_url(default)
    return str(default)


_METAVARS: dict[Any, str] = {int: "N", float: "NUMBER", Path: "PATH", str: "TEXT"}


def _add_option(p: Any, cls: type[BaseSettings], name: str, field: FieldInfo, extra: dict[str, Any]) -> None:
    kind, is_list = _plain_type(field.annotation)
    default = _shown_default(field, extra)
    env = _env_names(cls, name, field)
    notes = ([f"default: {default}"] if default is not None else []) + [f"env: {' or '.join(env)}"]
    kwargs: dict[str, Any] = {"help": f"{field.description or ''} [{'; '.join(notes)}]".strip(), "default": None}
    if extra.get("positional"):
        p.add_argument(name, nargs="?", metavar=extra.get("metavar") or name.upper(), **kwargs)
        return
    kwargs["metavar"] = extra.get("metavar") or _METAVARS.get(kind)
    if kind is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
        kwargs.pop("metavar")
    elif get_origin(kind) is Literal:
        kwargs["choices"] = list(get_args(kind))
    elif kind in (int, float, Path):
        kwargs["type"] = kind
    if is_list and extra.get("repeat"):
        kwargs["action"] = "append"
    p.add_argument(extra.get("flag") or _flag(name), dest=name, **kwargs)


class _RepeatedConnectError(logging.Filter):
    """aiormq logs every failed connect before raising it; qbroker.connection reports the same failure itself
    (naming the URL without its password), so aiormq's line would only say it twice."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("error when creating transport")


def drop_repeated_connect_errors() -> None:
    """A program's logging (never the library's on import): without aiormq's repeat of a failed connect."""
    aiormq_log = logging.getLogger("aiormq.connection")
    if not any(isinstance(f, _RepeatedConnectError) for f in aiormq_log.filters):
        aiormq_log.addFilter(_RepeatedConnectError())
