"""``innet`` and its subcommands: help on one screen, each command's own flags, one clear line for a
combination of flags that means nothing."""

import json
import os
import subprocess
import sys

import pytest

from innet import cli, commands

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def innet(*args, cwd=None, timeout=600):
    env = dict(os.environ, COLUMNS="80", PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "innet", *args], capture_output=True, text=True, cwd=cwd or ROOT,
                          env=env, timeout=timeout)


def test_innet_help_fits_on_one_screen_and_names_every_subcommand():
    out = innet("--help")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert len(lines) <= 25 and max(map(len, lines)) <= 80, out.stdout
    for name in ("run", "plan", "train", "bench", "clean", "reproduce"):
        assert any(line.split()[:1] == [name] for line in lines), name


def flags_of(help_text: str) -> set[str]:
    """The flags in a help text's usage lines (``-h`` as --help)."""
    usage = help_text.split("\n\n")[0].replace("[-h]", "[--help]")
    return {w.strip("[]") for w in usage.split() if w.startswith(("--", "[--"))}


def sections_of(help_text: str) -> list[str]:
    return [line[:-1] for line in help_text.splitlines() if line.endswith(":") and not line.startswith(" ")]


def test_each_subcommand_shows_its_own_flags_in_sections():
    run, plan, train = (innet(name, "--help").stdout for name in ("run", "plan", "train"))
    assert sections_of(run) == ["options", "backend", "topology", "job", "workload", "shared input", "consistency",
                                "faults", "output"]
    assert sections_of(plan) == ["options", "topology", "job", "workload", "shared input"]
    assert sections_of(train)[:3] == ["options", "backend", "training"]
    # run takes every flag of run_topology.py but cleaning and training a model (--plan-only: as innet plan)
    flat = {s for a in cli.parser()._actions for s in a.option_strings if s.startswith("--")}
    training = {"--train", "--model", "--epochs", "--batch", "--lr", "--hidden"}
    assert flags_of(run) == flat - {"--help", "--clean"} - training | {"--help"}
    assert {"--k", "--mode", "--workload", "--slice", "--input-elements"} <= flags_of(plan)
    assert not flags_of(plan) & {"--backend", "--loss", "--crash", "--out", "--consistency", "--pcap", "--seed", "--train"}
    assert training | {"--mode", "--topk", "--staleness", "--backend"} <= flags_of(train)
    assert not flags_of(train) & {"--workload", "--elements", "--iterations", "--slice", "--plan-only"}
    assert flags_of(innet("reproduce", "--help").stdout) == {"--help", "--list", "--backend", "--quick", "--out", "--jobs"}
    assert flags_of(innet("clean", "--help").stdout) == {"--help"}


def test_every_field_of_the_run_spec_has_a_flag_and_every_flag_a_field():
    """RunSpec is the one definition of the options: the flags are made from its fields, one each (the faults
    of every link one per FaultSpec field a user sets), plus the command's two actions."""
    import dataclasses

    from innet.planning.spec import FAULT_HELP, RunSpec

    flags = {a.dest: a.option_strings for a in cli.parser()._actions if a.dest != "help"}
    fields = {f.name for f in dataclasses.fields(RunSpec)}
    assert set(flags) == (fields - {"faults"}) | {f"faults.{k}" for k in FAULT_HELP} | set(cli.ACTIONS)
    assert all(len(strings) == 1 for strings in flags.values())  # one flag each
    assert cli.flag_names() == {s[2:] for strings in flags.values() for s in strings} - {"plan-only", "clean"}


def test_a_flag_of_another_subcommand_is_refused_in_one_line():
    out = innet("plan", "--loss", "0.1")
    assert out.returncode == 2
    assert out.stderr == "error: unrecognized arguments: --loss 0.1 (see --help)\n"


@pytest.mark.parametrize("args,message", [
    (["--k", "8"], "--k shapes fat-tree: it means nothing with --topo leaf-spine"),
    (["--topo", "star", "--k", "4"], "--k shapes fat-tree: it means nothing with --topo star"),
    (["--topo", "fat-tree", "--racks", "3"], "--racks shapes leaf-spine and phub-rack: it means nothing with --topo fat-tree"),
    (["--topo", "star", "--hosts-per-rack", "3"],
     "--hosts-per-rack shapes leaf-spine and phub-rack: it means nothing with --topo star"),
    (["--topo", "phub-rack", "--spines", "2"], "--spines shapes leaf-spine: it means nothing with --topo phub-rack"),
    (["--topo", "star", "--oversubscription", "2"],
     "--oversubscription shapes leaf-spine and phub-rack: it means nothing with --topo star"),
    (["--pipeline", "2"], "--pipeline overlaps a workload's compute with its communication: it needs --workload"),
    (["--staleness", "2"], "--staleness is SSP's bound: it needs --consistency ssp"),
    (["--mode", "pbox", "--consistency", "bsp", "--staleness", "2"], "--staleness is SSP's bound: it needs --consistency ssp"),
    (["--pcap", "caps"], "--pcap is Mininet's: it means nothing with --backend local"),
    (["--cli"], "--cli is Mininet's: it means nothing with --backend local"),
    (["--node-group", "4"], "--node-group is Mininet's: it means nothing with --backend local"),
    (["--hop-latency", "0.001"], "--hop-latency means nothing without --predict"),
    (["--epochs", "3"], "--epochs means nothing without --train"),
    (["--seed", "-1"], "--seed must be a non-negative integer, got -1"),
])
@pytest.mark.parametrize("how", ["run_topology.py", "innet run"])
def test_a_combination_that_means_nothing_is_one_line(args, message, how, tmp_path):
    argv = ["--backend", "local", *args, "--out", str(tmp_path)]
    if how == "run_topology.py":
        out = subprocess.run([sys.executable, os.path.join(ROOT, "run_topology.py"), *argv], capture_output=True,
                             text=True, timeout=600)
    else:
        out = innet("run", *argv)
        if "--epochs" in args:  # not a flag of innet run at all
            message = "unrecognized arguments: --epochs 3 (see --help)"
    assert (out.returncode, out.stderr, out.stdout) == (2, f"error: {message}\n", "")


def test_the_meaningful_combinations_still_run(tmp_path):
    for args in (["--topo", "fat-tree", "--k", "4"], ["--racks", "3", "--spines", "2"], ["--topo", "phub-rack", "--hosts-per-rack", "2"]):
        out = innet("plan", *args)
        assert out.returncode == 0 and "predicted bytes" in out.stdout, out.stderr
    out = innet("run", "--backend", "local", "--mode", "pbox", "--consistency", "ssp", "--staleness", "1", "--elements", "2000",
                "--iterations", "3", "--no-plots", "--out", str(tmp_path))
    assert out.returncode == 0 and "bound 1" in out.stdout, out.stderr


def test_seed_minus_one_was_a_traceback_in_numpy_and_is_refused_by_the_run_spec():
    from innet.errors import UserError
    from innet.planning.spec import RunSpec

    with pytest.raises(UserError) as err:
        RunSpec(seed=-1)
    assert err.value.render(cli.flag) == "--seed must be a non-negative integer, got -1"


def test_innet_run_is_run_topology_py(tmp_path):
    argv = ["--backend", "local", "--topo", "star", "--workers", "3", "--elements", "5000", "--mode", "all", "--no-plots"]
    a = innet("run", *argv, "--out", str(tmp_path / "a"))
    b = subprocess.run([sys.executable, os.path.join(ROOT, "run_topology.py"), *argv, "--out", str(tmp_path / "b")],
                       capture_output=True, text=True, timeout=600)
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    runs = [json.loads((tmp_path / d / "results.json").read_text())["runs"] for d in "ab"]
    assert [r["mode"] for r in runs[0]] == ["innet", "pbox", "ring"]
    assert [(r["result_digest"], r["link_bytes"], r["completion_s"]) for r in runs[0]] == [
        (r["result_digest"], r["link_bytes"], r["completion_s"]) for r in runs[1]]


def test_innet_plan_prints_the_plan_and_starts_nothing(tmp_path):
    out = innet("plan", "--topo", "fat-tree", "--placement", "tree", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("topology fat-tree-k4: mode innet, placement tree") and "predicted bytes" in out.stdout
    assert not os.path.exists(tmp_path / "results")


def test_innet_train_trains_digits_by_default(tmp_path):
    out = innet("train", "--backend", "local", "--topo", "star", "--workers", "2", "--epochs", "1", "--no-plots",
                "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    [run] = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert run["train"] == "digits" and run["correct"] is True


def test_innet_bench_lists_the_benchmarks_and_refuses_an_unknown_one():
    out = innet("bench", "--list")
    names = [line.split()[0] for line in out.stdout.splitlines()]
    expected = ["allreduce", "blocks", "dilation", "fabric", "fidelity", "loss", "scale", "switch", "torch_calls"]
    assert out.returncode == 0 and names == commands.bench_names() == expected
    out = innet("bench", "nope")
    assert (out.returncode, out.stderr) == (2, "error: unknown benchmark 'nope'; choose one of "
                                               "allreduce, blocks, dilation, fabric, fidelity, loss, scale, switch, torch_calls\n")


def test_innet_bench_runs_one_by_name_with_its_own_flags():
    out = innet("bench", "blocks", "--rounds", "5", "--repeats", "1")
    assert out.returncode == 0, out.stderr
    assert "batch" in out.stdout


def test_innet_clean_is_run_topology_clean(monkeypatch, capsys):
    """Checked in-process, with the cleaner replaced: a real clean here could reap another run's leftovers."""
    from innet.backends.mininet import cleanup

    monkeypatch.setattr(cleanup, "clean_leftovers", lambda: "cleaned 0 interrupted run(s)")
    assert commands.main(["clean"]) == 0 and cli.main(["--clean"]) == 0
    assert capsys.readouterr().out == "cleaned 0 interrupted run(s)\n" * 2


def test_the_console_entry_point_is_the_innet_command():
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts == {"innet": "innet.commands:console"}
    module, _, name = scripts["innet"].partition(":")
    assert module == commands.__name__ and callable(getattr(commands, name))


def test_a_field_added_to_the_run_spec_is_a_flag_of_innet_run(monkeypatch, capsys):
    """A new option is a field with its Option: its flag reaches ``innet run`` in its section, with no other edit."""
    import dataclasses

    from innet.planning.options import option
    from innet.planning.spec import RunSpec

    Warped = dataclasses.make_dataclass("Warped", [("warp_factor", float, option(1.0, group="job", help="a new option"))],
                                        bases=(RunSpec,), frozen=True)
    monkeypatch.setattr(cli, "RunSpec", Warped)
    with pytest.raises(SystemExit):
        commands.main(["run", "--help"])
    text = capsys.readouterr().out
    assert "--warp-factor WARP_FACTOR" in text.split("\njob:\n")[1].split("\n\n")[0]


def test_the_subcommands_name_only_sections_and_fields_that_exist():
    import dataclasses

    from innet.planning.options import GROUPS
    from innet.planning.spec import RunSpec

    fields = {f.name for f in dataclasses.fields(RunSpec)}
    for name, (_, groups, left_out) in commands.SUBCOMMANDS.items():
        assert set(groups) <= set(GROUPS) and set(left_out) <= fields, name
