"""The `tgictl` command line: global logging options, the command registry, and the single place
where errors become exit codes.

A known error (any TgictlError, or a bad argument) prints one readable line on stderr and exits with
the error's exit code; the traceback is shown only at log level debug. Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import typer

from tgictl import __version__
from tgictl.cli_help import FlagSafeGroup, plain_help
from tgictl.config import LOG_LEVELS, LogConfig
from tgictl.env import Env
from tgictl.errors import ConfigError, TgictlError, UsageError
from tgictl.log import configure_logging, export_to_children

# Every subcommand lives in its own module exposing `register(app: typer.Typer) -> None`.
# Adding a command is adding one line here.
COMMAND_MODULES: tuple[str, ...] = (
    "tgictl.commands.download",
    "tgictl.commands.convert",
    "tgictl.commands.profile",
    "tgictl.commands.shard",
    "tgictl.commands.router",
    "tgictl.commands.launch",
    "tgictl.commands.bench",
)


def _usage_error_types() -> tuple[type[Exception], ...]:
    """Bad-argument exceptions: typer >= 0.25 raises its own TyperException (it vendors click);
    older typer raises click's ClickException."""
    types: list[type[Exception]] = []
    if hasattr(typer, "TyperException"):
        types.append(typer.TyperException)
    try:
        import click

        types.append(click.ClickException)
    except ImportError:
        pass
    return tuple(types)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"tgictl {__version__}")
        raise typer.Exit(0)


@dataclass
class _RunState:
    """What the error handler must know about the run: the logging setup the callback chose."""

    log_config: LogConfig | None = None


def build_app(state: _RunState | None = None) -> typer.Typer:
    """A fresh Typer app with every registered command (no global state: tests build their own)."""
    state = state if state is not None else _RunState()
    app = typer.Typer(
        name="tgictl",
        help="Serve large language models the way text-generation-inference v3 does.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        # Plain help: rich's option table cut flag names at 80 columns (cli_help.py).
        rich_markup_mode=None,
        cls=FlagSafeGroup,
        context_settings={"help_option_names": ["-h", "--help"]},
    )

    @app.callback()
    def _global_options(
        ctx: typer.Context,
        log_level: Optional[str] = typer.Option(
            None,
            "--log-level",
            help=f"One of {', '.join(LOG_LEVELS)} (default: info; env TGICTL_LOG_LEVEL or LOG_LEVEL).",
            metavar="LEVEL",
            show_default=False,
        ),
        json_output: Optional[bool] = typer.Option(
            None,
            "--json-output/--no-json-output",
            help="Log JSON lines and print results as JSON (env TGICTL_JSON_OUTPUT).",
            show_default=False,
        ),
        version: bool = typer.Option(
            False, "--version", help="Print the version and exit.", is_eager=True, callback=_print_version
        ),
    ) -> None:
        env = Env.from_environ()
        try:
            config = LogConfig(
                level=log_level if log_level is not None else (env.log_level or "info"),
                json_output=json_output if json_output is not None else env.json_output,
            )
        except ConfigError as err:
            if log_level is not None:
                raise
            # The level came from the environment, not from a flag the user typed.
            raise ConfigError(f"{err.message} (from TGICTL_LOG_LEVEL or LOG_LEVEL)") from None
        state.log_config = config
        ctx.obj = config  # commands read it to print their result as text or JSON
        configure_logging(config)
        # Every process started from here (shards, router) logs the same way without being told.
        export_to_children(config)

    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(app)
    plain_help(app)
    return app


def _report(err: Exception, state: _RunState, exit_code: int) -> int:
    """Print one line for a known error (a JSON object with --json-output) and return the exit code."""
    config = state.log_config
    if config is not None and config.level == "debug":
        traceback.print_exception(err, file=sys.stderr)
    if isinstance(err, TgictlError):
        message, error_type = err.message, err.error_type
    else:  # click's bad-argument errors
        message, error_type = _click_message(err), UsageError.error_type
    message = " ".join(message.split())  # one line, whatever the message held
    if config is not None and config.json_output:
        print(json.dumps({"level": "error", "error_type": error_type, "message": message}), file=sys.stderr)
    else:
        print(f"Error: {message}", file=sys.stderr)
    return exit_code


def _click_message_text(err: Exception) -> str:
    format_message = getattr(err, "format_message", None)
    return str(format_message() if callable(format_message) else err)


def _click_message(err: Exception) -> str:
    message = _click_message_text(err)
    ctx = getattr(err, "ctx", None)
    if ctx is not None:
        message += f" (see '{ctx.command_path} --help')"
    return message


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tgictl` script and `python -m tgictl`; returns the exit code."""
    state = _RunState()
    try:
        app = build_app(state)
        result = app(args=list(argv) if argv is not None else None, prog_name="tgictl", standalone_mode=False)
    except TgictlError as err:
        return _report(err, state, err.exit_code)
    except _usage_error_types() as err:  # unknown option, missing argument, bad choice...
        exit_code = getattr(err, "exit_code", 2)
        if type(err).__name__ == "NoArgsIsHelpError":  # bare `tgictl` (click >= 8.2): its message is the help
            print(_click_message_text(err))
            return exit_code
        if not _click_message_text(err).strip():  # bare `tgictl` on older click: help was printed
            return exit_code
        return _report(err, state, exit_code)
    except typer.Exit as err:
        return err.exit_code
    except (typer.Abort, KeyboardInterrupt):
        print("Aborted.", file=sys.stderr)
        return 130
    # standalone_mode=False returns the exit code of --help / typer.Exit as the result.
    return result if isinstance(result, int) else 0
