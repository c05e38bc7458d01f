"""The command line keeps every command and flag first agreed (tests/fixtures/spec-names.json): tests, the README, the
systemd unit and operators' scripts call them, so one is never renamed or removed."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from repofiles import SPEC_NAMES, spec_names

from gpuwatch.cli.main import build_parser


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands: dict[str, argparse.ArgumentParser] = sub.choices
    return commands


def test_the_list_is_read() -> None:
    names = spec_names()
    assert {"metrics", "collectors", "alerts", "commands", "scenarios"} <= set(names)
    assert "--disable-collector" in names["commands"]["run"]


@pytest.mark.parametrize("command", sorted(spec_names()["commands"]))
def test_every_agreed_command_and_flag_is_there(command: str) -> None:
    commands = _commands()
    assert command in commands, f"`gpuwatch {command}` is in {SPEC_NAMES.name} but no longer a command"
    flags: list[Any] = spec_names()["commands"][command]
    missing = [f for f in flags if f not in commands[command]._option_string_actions]
    assert not missing, f"`gpuwatch {command}` lost the flags {missing} of {SPEC_NAMES.name}"
