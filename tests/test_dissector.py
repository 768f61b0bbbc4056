"""The Wireshark dissector (innet/wire/innet.lua) read by tshark: every field of every packet kind equals
scapy's dissection of the same frame, on frames from innet's own builders and on a real run's pcaps."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scapy.layers.l2 import Ether
from scapy.utils import RawPcapReader, wrpcap

from innet.switch.runtime import kind_of
from innet.wire.dissector import LUA_SCRIPT, install, plugin_dir
from innet.wire.layer import InnetAgg
from innet.wire.packet import ABORT, FLAG_NAMES, HEADER_DTYPE, SPARSE, make_packet, parse_frame
from tests.helpers import every_kind

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = list(HEADER_DTYPE.names)
PAYLOAD = ["value", "dense_count", "index", "abort_node", "missing_rank"]
FIELDS = HEADER + [f"flags.{n.lower()}" for n in FLAG_NAMES] + ["kind"] + PAYLOAD


def tshark(*args, env=None):
    assert shutil.which("tshark"), "tshark is not installed: make deps installs it (Debian package tshark)"
    out = subprocess.run(["tshark", *args], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout


def decoded(pcap, *lua):
    """Per frame of ``pcap``, the innet fields tshark decoded: {name: [values as text]} (empty: not innet)."""
    args = ["-r", str(pcap), "-T", "json", "-e", "frame.number", *(a for name in FIELDS for a in ("-e", f"innet.{name}"))]
    frames = json.loads(tshark(*(["-X", f"lua_script:{lua[0]}"] if lua else []), *args))
    return [{k.removeprefix("innet."): v for k, v in f["_source"]["layers"].items() if k.startswith("innet.")} for f in frames]


def expected(frame):
    """What the dissector should show for ``frame``, from scapy's dissection (values as tshark prints them)."""
    agg = Ether(frame)[InnetAgg]
    flags, values = int(agg.flags), [int(v) for v in agg.values]
    out = {name: [str(getattr(agg, name))] for name in HEADER}
    out["flags"] = [f"0x{flags:02x}"]
    out |= {f"flags.{n.lower()}": [str(int(bool(flags & 1 << bit)))] for bit, n in enumerate(FLAG_NAMES)}
    out["kind"] = [kind_of(parse_frame(frame))]
    if flags & SPARSE:
        payload = {"dense_count": values[:1], "index": values[1::2], "value": values[2::2]}
    elif flags & ABORT and values:
        payload = {"abort_node": values[:1], "missing_rank": values[1:]}
    else:
        payload = {"value": values}
    return out | {k: [str(v) for v in vs] for k, vs in payload.items() if vs}


@pytest.fixture(scope="module")
def kinds_pcap(tmp_path_factory):
    path = tmp_path_factory.mktemp("pcap") / "kinds.pcap"
    wrpcap(str(path), [Ether(f) for f in every_kind()])
    return path


def test_every_field_of_every_packet_kind_equals_scapys(kinds_pcap):
    frames = every_kind()
    assert {kind_of(parse_frame(f)) for f in frames} == {"contribution", "result", "abort", "routed"}
    got = decoded(kinds_pcap, LUA_SCRIPT)
    assert len(got) == len(frames)
    for k, (frame, fields) in enumerate(zip(frames, got, strict=True)):
        assert fields == expected(frame), f"frame {k + 1}"


def test_the_dissector_names_the_fields_as_the_header_and_readme_do():
    listed = tshark("-G", "fields", "-X", f"lua_script:{LUA_SCRIPT}")
    names = [line.split("\t")[2] for line in listed.splitlines() if line.startswith("F\t")]
    ours = {n.removeprefix("innet.") for n in names if n.startswith("innet.")}
    assert ours == set(FIELDS) | {"flags", "short", "sparse_odd"}
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    table = readme[readme.index("| field | bytes | meaning |"):]
    table = table[:table.index("\n\n")]
    rows = re.findall(r"^\| (\w+) \| (\d+) \|", table, re.M)
    assert [name for name, _ in rows] == HEADER
    assert [int(size) for _, size in rows] == [HEADER_DTYPE.fields[n][0].itemsize for n in HEADER]


def test_a_short_frame_is_marked_malformed_and_other_udp_is_left_alone(tmp_path):
    short = make_packet(np.arange(8), job=1, rank=1, chunk=9).to_frame(1, 2)[:-8]  # count says 8, 6 follow
    other = bytearray(make_packet(np.arange(8), job=1).to_frame(1, 2))
    other[36:38] = (4789).to_bytes(2, "big")  # UDP to another port (and from another: sport too)
    other[34:36] = (4789).to_bytes(2, "big")
    wrpcap(str(tmp_path / "x.pcap"), [Ether(short), Ether(bytes(other))])
    out = tshark("-X", f"lua_script:{LUA_SCRIPT}", "-r", str(tmp_path / "x.pcap"), "-T", "fields", "-e", "innet.chunk",
                 "-e", "innet.short", "-e", "innet.value", "-E", "occurrence=a")
    assert out.splitlines() == ["9\t1\t0,1,2,3,4,5", "\t\t"]
    marked = tshark("-X", f"lua_script:{LUA_SCRIPT}", "-r", str(tmp_path / "x.pcap"), "-Y", "_ws.malformed || innet.short")
    assert len(marked.splitlines()) == 1


def test_install_puts_it_where_tshark_loads_it_without_x(tmp_path, kinds_pcap):
    env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=ROOT)
    env.pop("XDG_CONFIG_HOME", None)
    out = subprocess.run([sys.executable, "-m", "innet.wire.dissector", "--install"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    dest = tmp_path / ".local" / "lib" / "wireshark" / "plugins" / "innet.lua"
    assert str(dest) in out.stdout and dest.read_text() == Path(LUA_SCRIPT).read_text()
    folders = tshark("-G", "folders", env=env)
    assert re.search(rf"Personal Lua Plugins:\s+{re.escape(os.path.dirname(dest))}$", folders, re.M)
    protocols = tshark("-r", str(kinds_pcap), "-T", "fields", "-e", "_ws.col.Protocol", env=env).split()
    assert protocols == ["innet"] * len(every_kind())
    dest.unlink()
    assert set(tshark("-r", str(kinds_pcap), "-T", "fields", "-e", "_ws.col.Protocol", env=env).split()) == {"UDP"}


def test_install_into_a_given_folder_and_path(tmp_path):
    assert install(str(tmp_path / "p")) == str(tmp_path / "p" / "innet.lua")
    assert (tmp_path / "p" / "innet.lua").read_text().startswith("-- Wireshark dissector for innet")
    assert plugin_dir().endswith(os.path.join(".local", "lib", "wireshark", "plugins"))
    out = subprocess.run([sys.executable, "-m", "innet.wire.dissector", "--path"], env=dict(os.environ, PYTHONPATH=ROOT),
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == LUA_SCRIPT


@pytest.mark.mininet
def test_a_real_runs_pcaps_decode_field_by_field(tmp_path):
    from innet.backends.mininet.emulation import run_mininet
    from innet.planning.spec import RunSpec
    from topologies import build

    graph = build("star", workers=2)
    assert run_mininet(graph, RunSpec(elements=600, min_rto=0.02), pcap_dir=str(tmp_path))["correct"]
    topk = RunSpec(elements=600, topk=0.05, program="topk_sparse", min_rto=0.02)
    assert run_mininet(graph, topk, pcap_dir=str(tmp_path / "topk"))["correct"]
    seen = set()
    for pcap in sorted(tmp_path.glob("**/*.pcap")):
        with RawPcapReader(str(pcap)) as reader:
            frames = [bytes(data) for data, _ in reader]
        got = decoded(pcap, LUA_SCRIPT)
        assert len(got) == len(frames)
        for k, (frame, fields) in enumerate(zip(frames, got, strict=True)):
            if InnetAgg in Ether(frame):
                assert fields == expected(frame), f"{pcap.name} frame {k + 1}"
                seen.add((fields["kind"][0], int(fields["flags"][0], 16) & SPARSE))
            else:
                assert fields == {}, f"{pcap.name} frame {k + 1}"
    assert seen >= {("contribution", 0), ("result", 0), ("contribution", SPARSE), ("result", SPARSE)}
