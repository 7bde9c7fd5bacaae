"""One CLI shape over every ``rigfleet`` command (rigfleet/cli.py, rigfleet/cliargs.py): --help
exits 0, a usage error exits 2 (verify: 101), a missing inventory is an error that names it,
every command that takes --inventory takes --limit; --version; --limit by host or group;
--yes before a command that changes hosts; a roll that reaches no host fails."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from rigfleet import __version__
from rigfleet.cli import build_parser, main
from rigfleet.cliargs import UsageError, confirm, run_command, select
from rigfleet.inventory import InventoryError, InventoryHost, load_inventory


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[
        tuple[str, ...], argparse.ArgumentParser]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {path: parser}
    out: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for name, child in subs[0].choices.items():
        out.update(_leaves(child, (*path, name)))
    return out


LEAVES = _leaves(build_parser())
COMMANDS = sorted(LEAVES)
# What a command needs besides --inventory before it reads the inventory.
NEEDS = {("bump",): ["--latest"], ("images", "export"): ["--host", "rig-a", "--to", "/tmp/x"],
         ("images", "import"): ["/nonexistent.tar", "--host", "rig-a"],
         ("logs",): ["rig-a"], ("lock",): ["rig-a"]}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def _exit(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)


def test_every_command_is_listed():
    names = {c[0] for c in COMMANDS}
    assert {"status", "endpoints", "roll", "bump", "bench", "doctor", "images", "pins",
            "verify", "testbed"} <= names


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_exits_0(command, capsys):
    assert _exit([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: rigfleet " + " ".join(command) in " ".join(out.split())


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_usage_error_exits_2(command, capsys):
    code = _exit([*command, "--no-such-option"])
    assert code == (101 if command == ("verify",) else 2)
    assert "error" in capsys.readouterr().err


def test_version(capsys):
    assert _exit(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"rigfleet {__version__}"


def test_verify_names_itself_and_keeps_101(capsys):
    assert _exit(["verify"]) == 101
    assert "usage: rigfleet verify" in capsys.readouterr().err


FLEET = [c for c in COMMANDS if "--inventory" in _options(LEAVES[c])]


def test_the_fleet_commands():
    assert {c[0] for c in FLEET} >= {"status", "endpoints", "roll", "bump", "bench", "doctor",
                                     "images"}


@pytest.mark.parametrize("command", FLEET, ids=" ".join)
def test_every_fleet_command_takes_the_shared_options(command):
    assert {"--inventory", "--limit", "--json", "--timeout"} <= _options(LEAVES[command])
    args = LEAVES[command].parse_args([*NEEDS.get(command, []), "--limit", "a", "--limit",
                                       "b"])
    assert args.limit == ["a", "b"]


@pytest.mark.parametrize("command", FLEET, ids=" ".join)
def test_a_missing_inventory_is_an_error(command, capsys):
    code = _exit([*command, *NEEDS.get(command, []), "--inventory", "no-such-inventory.py"])
    err = " ".join(capsys.readouterr().err.split())
    assert code != 0
    assert "no-such-inventory.py: no such file; allowed: a pyinfra inventory file" in err, err


def test_an_empty_inventory_is_an_error(tmp_path):
    inv = tmp_path / "empty.py"
    inv.write_text("hosts = []\n")
    with pytest.raises(InventoryError, match=r"empty.py: no hosts; allowed"):
        load_inventory(inv)


@pytest.mark.parametrize("error", [subprocess.TimeoutExpired(["pyinfra"], 60),
                                   FileNotFoundError(2, "No such file or directory")])
def test_an_inventory_pyinfra_cannot_read_in_time_or_at_all_is_an_error(
    tmp_path, monkeypatch, error
):
    # these escaped load_inventory as a traceback (TimeoutExpired is no ValueError either)
    inv = tmp_path / "slow.py"
    inv.write_text("hosts = ['a']\n")

    def run(*args, **kwargs):
        raise error

    monkeypatch.setattr(subprocess, "run", run)
    with pytest.raises(InventoryError, match=r"cannot load inventory .*slow.py: "):
        load_inventory(inv)


def _host(name: str, *groups: str) -> InventoryHost:
    return InventoryHost(name, groups, {})


def test_limit_takes_hosts_and_groups_in_inventory_order():
    hosts = [_host("a", "canary"), _host("b", "rest"), _host("c", "rest")]
    assert [h.name for h in select(hosts, ["c", "canary"], "inv.py")] == ["a", "c"]
    assert [h.name for h in select(hosts, ["rest"], "inv.py")] == ["b", "c"]
    assert select(hosts, [], "inv.py") == hosts
    with pytest.raises(UsageError, match=r"inv.py: --limit: zz; allowed: a host \(a, b, c\) "
                                         r"or a group \(canary, rest\)"):
        select(hosts, ["zz"], "inv.py")


def test_an_error_is_one_line_however_long_so_a_path_in_it_is_never_broken(capsys):
    path = "/srv/" + "a-very-long-directory-name/" * 6 + "saved.tar"

    def fails(args: argparse.Namespace) -> int:
        raise UsageError(f"--to {path}: File exists; allowed: a directory")

    assert run_command(argparse.Namespace(func=fails)) == 2
    assert capsys.readouterr().err == f"error: --to {path}: File exists; allowed: a directory\n"


def test_confirm_refuses_without_a_terminal_naming_yes(monkeypatch):
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    with pytest.raises(UsageError, match="not a terminal.*pass --yes"):
        confirm(argparse.Namespace(yes=False), "roll")
    confirm(argparse.Namespace(yes=True), "roll")  # --yes: no question


def test_confirm_asks_at_a_terminal(monkeypatch):
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda _prompt: "y")
    confirm(argparse.Namespace(yes=False), "roll")
    monkeypatch.setattr("builtins.input", lambda _prompt: "")
    with pytest.raises(UsageError, match="not confirmed; nothing changed"):
        confirm(argparse.Namespace(yes=False), "roll")


def test_confirm_takes_end_of_input_at_the_prompt_as_no(monkeypatch):
    def ctrl_d(_prompt):
        raise EOFError

    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr("builtins.input", ctrl_d)
    with pytest.raises(UsageError, match="not confirmed; nothing changed"):
        confirm(argparse.Namespace(yes=False), "roll")


def test_testbed_help_without_the_testbed_package(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rigfleet_testbed.cli", None)  # import fails
    assert _exit(["testbed", "--help"]) == 0
    assert "pip install -e ./testbed" in " ".join(capsys.readouterr().out.split())
    assert _exit(["testbed", "up", "--hosts", "2"]) == 2
    assert "not installed here" in " ".join(capsys.readouterr().err.split())


def test_roll_without_a_terminal_refuses_before_anything_runs(tmp_path):
    """An unreachable host is skipped at planning; with one reachable nothing would still run
    without --yes. Here no host is reachable: the roll fails, saying it reached no host."""
    inv = tmp_path / "inv.py"
    inv.write_text('gpu_hosts = [("r1", {"ssh_hostname": "127.0.0.1", "ssh_port": 9})]\n')
    proc = subprocess.run([sys.executable, "-m", "rigfleet.cli", "roll", "--inventory",
                           str(inv), "--timeout", "3"], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, cwd=Path(__file__).parents[2], timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "reached no host" in " ".join(proc.stderr.split())


@pytest.mark.parametrize("argv", [["bump", "--latest", "--batch-size", "0"],
                                  ["bump", "--latest", "--max-failures", "0"],
                                  ["rollback", "--batch-size", "0"],
                                  ["rollback", "--max-failures", "-1"],
                                  ["roll", "--batch", "0"], ["roll", "--max-failures", "0"]],
                         ids=" ".join)
def test_batches_and_failures_below_one_are_refused_before_anything_runs(argv, tmp_path, capsys):
    """One rule for the options ``add_rollout`` defines (bump, rollback and roll each checked
    them in their own words, rollback and roll only after reading the inventory)."""
    assert _exit([*argv, "--inventory", str(tmp_path / "none.py")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"argument {argv[-2]}: '{argv[-1]}': allowed: an integer >= 1" in err
