"""The command line: ``run_topology.py`` (and ``innet run``), a thin client of ``innet.run`` and ``innet.plan``.

Its flags are made from ``RunSpec``'s fields (innet.planning.spec): each field's ``Option`` gives the flag, its
help, its section and how its text is read; ``RunSpec.validate`` holds every rule. Beyond them the command
has two actions of its own: ``--plan-only`` and ``--clean``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import typing
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TextIO

from innet.errors import UserError
from innet.events import Event, listening
from innet.planning.options import GROUPS, default_of, flag_of, options_of
from innet.planning.spec import FAULT_HELP, RunSpec
from innet.results.files import NewFolder

ACTIONS = ("plan_only", "clean")  # the command's own flags, not options of a run
Options = dict[str, Any]  # innet.run's keyword options, as the flags give them: the edge where text becomes values


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """Bad flags are one line too (argparse would print the usage first and exit)."""
        raise UserError(f"{message} (see --help)")


def _typed(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An option's parser as argparse wants it: its ValueError's reason becomes the one line argparse prints."""
    def read(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return read


def _base(hint: Any) -> Any:
    """The type a flag's text is read as: ``int`` of ``int | None``."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def add_options(p: argparse.ArgumentParser, groups: Sequence[str] = GROUPS, left_out: Sequence[str] = ()) -> None:
    """``RunSpec``'s options in ``groups`` (but ``left_out``) as flags of ``p``, a section per group. No flag has a
    default: the namespace holds only the flags given, and ``RunSpec`` the defaults."""
    sections = {g: p.add_argument_group(g) for g in groups}
    hints = typing.get_type_hints(RunSpec)
    for f, opt in options_of(RunSpec):
        if opt.group not in sections or f.name in left_out:
            continue
        section = sections[opt.group]
        if f.name == "faults":  # one flag per fault of every link direction
            for name, text in FAULT_HELP.items():
                section.add_argument(f"--{name}", dest=f"faults.{name}", type=float, default=argparse.SUPPRESS, help=text,
                                     metavar=name.upper())
            continue
        if opt.switch:
            section.add_argument(flag_of(f), dest=f.name, default=argparse.SUPPRESS, help=opt.help,
                                 action="store_false" if default_of(f) is True else "store_true")
        else:
            section.add_argument(flag_of(f), dest=f.name, default=argparse.SUPPRESS, help=opt.help,
                                 type=_typed(opt.parse) if opt.parse else _base(hints[f.name]), metavar=opt.metavar,
                                 choices=opt.choices, action="append" if opt.repeat else "store")


def parser() -> argparse.ArgumentParser:
    """``run_topology.py``'s parser: every option, and the two actions."""
    p = Parser(prog="run_topology.py",
                description="Run gradient all-reduce over an emulated topology, in-network and as baselines, "
                            "check every result and report where the bytes went.")
    add_options(p)
    actions = p.add_argument_group("maintenance")
    actions.add_argument("--plan-only", action="store_true", help="print the placement plan and predicted bytes, start nothing")
    actions.add_argument("--clean", action="store_true", help="remove what an interrupted innet run left behind, then exit")
    return p


def options(args: argparse.Namespace) -> Options:
    """The options the flags of ``args`` give, as ``innet.run`` takes them."""
    given = {k: v for k, v in vars(args).items() if k not in ACTIONS and k != "command"}
    out = {k.removeprefix("faults."): tuple(v) if isinstance(v, list) else v for k, v in given.items()}
    return out


def parse_options(argv: Sequence[str]) -> Options:
    """The options of an ``innet run`` command line (a ``UserError`` for bad flags)."""
    return options(parser().parse_args(list(argv)))


def flag_names() -> set[str]:
    """Every flag of ``innet run``, without its dashes."""
    names = {flag_of(f)[2:] for f, _ in options_of(RunSpec) if f.name != "faults"}
    return names | set(FAULT_HELP)


def flag(field: str) -> str:
    """The flag that sets ``RunSpec`` field ``field`` (a fault's name: its own flag)."""
    for f, _ in options_of(RunSpec):
        if f.name == field:
            return flag_of(f)
    return "--" + field.replace("_", "-")


def main(argv: list[str] | None = None) -> int:
    return guarded(lambda: execute(parser().parse_args(argv)))


class Render:
    """The library's events (innet.events) on ``stream``: a line ``innet: MESSAGE`` each; progress on a terminal as
    one tqdm line redrawn in place, elsewhere (a log, CI) a line every ``every`` seconds."""

    def __init__(self, stream: TextIO | None = None, every: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every, self.clock, self.shown_at = every, clock, float("-inf")
        self.bar: Any = None

    def __call__(self, event: Event) -> None:
        if event.kind == "progress":
            if self.tty:
                if self.bar is None:
                    from tqdm import tqdm

                    self.bar = tqdm(file=self.stream, bar_format="{desc}", mininterval=0, dynamic_ncols=True, delay=1e9)
                self.bar.set_description_str(event.message)
            elif self.clock() - self.shown_at >= self.every:  # a log keeps a line every few seconds readable
                self.shown_at = self.clock()
                self.stream.write(event.message + "\n")
            return
        self.close()
        self.stream.write(f"innet: {event.message}\n")
        self.stream.flush()

    def close(self) -> None:
        """End a progress line drawn in place."""
        if self.bar is not None:
            self.bar.close()
            self.stream.write("\n")
            self.bar = None


def guarded(command: Callable[[], int]) -> int:
    """``command``'s exit status, the library's events drawn on stderr meanwhile; an error the user caused is one
    line on stderr (2), Ctrl-C 130."""
    render = Render()
    try:
        with listening(render):
            return command()
    except UserError as exc:
        render.close()
        print(f"error: {exc.render(flag)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        render.close()
        print("interrupted; everything this run created was removed", file=sys.stderr)
        return 130
    finally:
        render.close()


def execute(args: argparse.Namespace) -> int:
    """Run what the parsed flags ``args`` say."""
    if getattr(args, "clean", False):
        return _clean()
    if getattr(args, "plan_only", False):
        return _plan(options(args))
    return _run(options(args))


def _clean() -> int:
    from innet.backends.mininet.cleanup import clean_leftovers
    from innet.backends.mininet.shaper import release

    cleaned = clean_leftovers()
    print(cleaned + ("; turned htb's hysteresis mode off (an innet run had turned it on)" if release() else ""))
    return 0


def _plan(given: Options) -> int:
    from innet.api import plan

    for name in ("out", "json", "plots", "timeline"):
        if name in given:
            raise UserError(f"{{{name}}} says where a run's results go: a plan runs nothing and writes none")

    result = plan(**given)
    if result.spec.save_topology:
        print(f"topology: {result.spec.save_topology}")
    print(result.text())
    return 0


def _run(given: Options) -> int:
    from innet.api import run

    if given.get("out") == "":
        raise UserError("{out} wants a folder (without it: results/<timestamp>)")

    given.setdefault("out", NewFolder(os.path.join("results", time.strftime("%Y%m%d-%H%M%S"))))
    report = run(**given)
    if report.spec.save_topology:
        print(f"topology: {report.spec.save_topology}")
    for line in report.lines():
        print(line)
    print(f"results: {', '.join(report.files)}")
    if report.spec.timeline:
        print(f"timeline: {report.spec.timeline} (open it in Perfetto's UI or chrome://tracing)")
    for r in report.runs:
        for err in r.errors:
            print(f"error: {err}", file=sys.stderr)
    return 0 if report.correct else 1
