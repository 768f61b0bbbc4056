"""innet's Wireshark dissector (``innet.lua`` beside this module), and the command that installs it.

``python -m innet.wire.dissector --install`` copies the dissector into Wireshark's personal Lua
plugin folder, so Wireshark and tshark decode UDP port 48879 as innet from then on;
``--path`` prints where the shipped copy is, for ``tshark -X lua_script:PATH`` without installing.
The dissector names its fields as ``InnetAgg`` does (``innet.job`` ... ``innet.exp``);
tests/test_dissector.py holds the two to each other with tshark.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

LUA_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "innet.lua")


def plugin_dir() -> str:
    """Wireshark's personal Lua plugin folder on Linux and macOS (``tshark -G folders``: Personal Lua Plugins)."""
    return os.path.join(os.path.expanduser("~"), ".local", "lib", "wireshark", "plugins")


def install(folder: str | None = None) -> str:
    """Copy the dissector into ``folder`` (default: ``plugin_dir()``); returns the file written."""
    folder = folder or plugin_dir()
    os.makedirs(folder, exist_ok=True)
    return shutil.copyfile(LUA_SCRIPT, os.path.join(folder, os.path.basename(LUA_SCRIPT)))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m innet.wire.dissector", description=__doc__.splitlines()[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--install", action="store_true", help=f"copy innet.lua into {plugin_dir()} (as yourself, not root)")
    what.add_argument("--path", action="store_true", help="print the path of the shipped innet.lua")
    args = p.parse_args(argv)
    said = LUA_SCRIPT if args.path else (f"installed {install()}: Wireshark and tshark now decode UDP port 48879 as innet "
                                         "(display filter: innet)")
    sys.stdout.write(said + "\n")  # this command's answer


if __name__ == "__main__":
    main()
