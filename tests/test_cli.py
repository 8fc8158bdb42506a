"""The `retro` command line, run as a user would (no broker needed here).

Errors a user can hit are one line on stderr with a distinct exit code, never a
traceback; the codes are the ``exit_code`` of each error class in streams.errors.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from streams.cli import FAKE_LLM_FIELDS, main, make_parser, select_report
from streams.dev.fakellm import FakeLLMConfig
from streams.errors import (
    EXIT_AUDIT_FAILED,
    EXIT_BROKEN_PIPE,
    BrokerError,
    ConfigError,
    DeliveryFailed,
    InputError,
    KafkaUnreachable,
    NotAuthorized,
    OutputError,
    PortInUse,
    RetroError,
    UsageError,
)
from streams.report.state.model import Report
from streams.schemas import validator

from helpers import busy_port, closed_port

CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("RETRO_")}


@dataclass
class Run:
    code: int
    out: str
    err: str

    def one_line_error(self, code: int, *fragments: str) -> None:
        """Exit ``code``, and stderr is exactly one ``retro: ...`` line naming ``fragments``."""
        lines = self.err.strip().splitlines()
        assert self.code == code, (self.code, self.err)
        assert len(lines) == 1 and lines[0].startswith("retro: "), self.err
        assert "Traceback" not in self.err
        for fragment in fragments:
            assert fragment in lines[0], (fragment, lines[0])


@pytest.fixture
def retro(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
          capsys: pytest.CaptureFixture[str]) -> Callable[..., Run]:
    """`retro ARGS` in this process, with no RETRO_* from the caller's environment."""
    for name in [n for n in os.environ if n.startswith("RETRO_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)

    def run(*args: str, **env: str) -> Run:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        code = main(["--state-dir", str(tmp_path / "state"), *args])
        out, err = capsys.readouterr()
        return Run(code, out, err)

    return run


def retro_process(*args: str, timeout: float = 60, **kwargs: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streams", *args], capture_output=True,
                          text=True, timeout=timeout, env=CLEAN_ENV, **kwargs)


def test_retro_clean_writes_only_records_on_stdout(tmp_path: Path) -> None:
    from streams.dev.sample import write_sample

    paths = [str(p) for p in write_sample(tmp_path / "s", records=400, include_bad=True)]
    dead = tmp_path / "dead.jsonl"
    proc = subprocess.run([sys.executable, "-m", "streams", "clean", *paths, "--deadletter",
                           str(dead)], capture_output=True, timeout=120, check=True)
    lines = proc.stdout.decode().splitlines()
    check = validator("record")
    for line in lines:
        check.validate(json.loads(line))
    letters = [json.loads(x) for x in dead.read_text().splitlines()]
    assert letters and all(d["reason"] and d["detail"] for d in letters)
    assert len(lines) + len(letters) == 400
    summary = proc.stderr.decode()
    assert "json" in summary and "deadletter" in summary.lower().replace(" ", "").replace(
        "-", "").replace("_", "")


def test_retro_without_a_broker_says_what_to_do(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "streams", "--state-dir", str(tmp_path),
                           "audit"], capture_output=True, timeout=60, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == ConfigError.exit_code
    assert "retro broker start" in proc.stderr.decode()
    assert "Traceback" not in proc.stderr.decode()


def test_select_report_by_window_and_service() -> None:
    reports = {rid: Report(id=rid, services=svcs) for rid, svcs in [
        ("2026-11-28/all", ["a"]), ("2026-11-29/all", ["a", "b"]), ("undated/all", []),
        ("2026-11-29/b", ["b"])]}
    assert select_report(reports, window=None, service=None).id == "2026-11-29/b"
    assert select_report(reports, window="2026-11-28", service=None).id == "2026-11-28/all"
    assert select_report(reports, window="2026-11-29", service="b").id == "2026-11-29/b"
    assert select_report(reports, window="2026-11-28", service="a").id == "2026-11-28/all"
    assert select_report(reports, window="2025", service=None) is None


# ---------------------------------------------------------------- errors a user hits
def test_every_error_kind_has_its_own_exit_code() -> None:
    codes = [UsageError.exit_code, InputError.exit_code, OutputError.exit_code,
             ConfigError.exit_code, KafkaUnreachable.exit_code, PortInUse.exit_code,
             BrokerError.exit_code, RetroError.exit_code, EXIT_AUDIT_FAILED, EXIT_BROKEN_PIPE,
             NotAuthorized.exit_code, DeliveryFailed.exit_code]
    assert len(set(codes)) == len(codes) and 0 not in codes


@pytest.mark.parametrize(("command", "reader"), [
    (["deadletter"], "streams.report.ops.deadletters.read_deadletters"),
    (["review"], "streams.report.ops.reviews.read_reviews"),
    (["report"], "streams.report.store.read_reports")])
def test_a_topic_this_user_may_not_read_is_one_line_not_an_empty_answer(
        command: list[str], reader: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The broker hides a topic a user may not describe: "no dead letters" would be a lie."""
    import importlib

    from streams import cli
    from streams.kafka.readers import not_authorized

    async def refused(*args: object, **kwargs: object) -> None:
        raise not_authorized("retro.deadletter")

    module, _, name = reader.rpartition(".")
    monkeypatch.setattr(importlib.import_module(module), name, refused)
    monkeypatch.setattr(cli, "kafka", lambda settings: None)
    assert cli.main(command) == NotAuthorized.exit_code == 77
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert "not authorized to read retro.deadletter" in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["clean", "produce"])
def test_a_missing_input_file_is_one_line(retro: Callable[..., Run], tmp_path: Path,
                                          command: str) -> None:
    missing = tmp_path / "nope.log"
    retro(command, str(missing)).one_line_error(
        InputError.exit_code, str(missing), "no such file")


@pytest.mark.parametrize("command", ["clean", "produce"])
def test_a_folder_as_input_is_one_line(retro: Callable[..., Run], tmp_path: Path,
                                       command: str) -> None:
    retro(command, str(tmp_path)).one_line_error(
        InputError.exit_code, str(tmp_path), "folder", "*.log")


def test_produce_checks_every_file_before_sending_any(retro: Callable[..., Run],
                                                      tmp_path: Path) -> None:
    good = tmp_path / "good.log"
    good.write_text("2026-01-01 ERROR disk full\n")
    # no broker exists: the input error must come first, before any Kafka talk
    retro("produce", str(good), str(tmp_path / "typo.log")).one_line_error(
        InputError.exit_code, "typo.log")


def test_produce_without_paths_is_a_usage_error(retro: Callable[..., Run]) -> None:
    retro("produce").one_line_error(UsageError.exit_code, "produce needs log files", " - ")


def test_an_unwritable_deadletter_file_is_one_line(retro: Callable[..., Run],
                                                   tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("2026-01-01 ERROR disk full\n")
    retro("clean", str(log), "--deadletter", str(tmp_path)).one_line_error(
        OutputError.exit_code, "--deadletter", str(tmp_path))


@pytest.mark.parametrize("data, code, says", [
    ("{tmp}/nope", InputError.exit_code, "no such file or folder"),
    ("{tmp}/empty", InputError.exit_code, "holds no log files"),
    ("{tmp}/a.log,{tmp}/nope.log", InputError.exit_code, "nope.log"),
    ("{tmp}/a.log,{tmp}/empty", InputError.exit_code, "holds no log files"),
])
def test_demo_checks_its_data_before_starting_anything(
        retro: Callable[..., Run], tmp_path: Path, data: str, code: int, says: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "a.log").write_text("2026-01-01 ERROR disk full\n")
    retro("demo", "--data", data.format(tmp=tmp_path)).one_line_error(code, says)
    assert not (tmp_path / "state" / "broker").exists()  # no broker was started


def test_demo_checks_the_sample_size_before_starting_anything(
        retro: Callable[..., Run], tmp_path: Path) -> None:
    retro("demo", "--records", "10").one_line_error(UsageError.exit_code, "--records", "300")
    assert not (tmp_path / "state").exists()


def test_demo_checks_its_webhook_before_starting_anything(
        retro: Callable[..., Run], tmp_path: Path) -> None:
    retro("demo", "--notify-webhook", "hooks.example.com/services/s3cr3t").one_line_error(
        UsageError.exit_code, "--notify-webhook", "http")
    assert "s3cr3t" not in retro("demo", "--notify-webhook", "ftp://x/s3cr3t").err
    assert not (tmp_path / "state" / "broker").exists()


def test_demo_refuses_a_chosen_web_port_in_use_before_starting_anything(
        retro: Callable[..., Run], tmp_path: Path) -> None:
    with busy_port() as port:
        retro("demo", RETRO_WEB_PORT=str(port)).one_line_error(
            PortInUse.exit_code, str(port), "RETRO_WEB_PORT")
    assert not (tmp_path / "state" / "broker").exists()


def test_demo_moves_off_a_default_web_port_in_use(tmp_path: Path) -> None:
    from streams.dev.demo import choose_web_port
    from streams.settings import Settings

    with busy_port() as port:
        chosen, note = choose_web_port(Settings(web_port=port), user_chose=False)
        assert chosen.web_port != port and note and str(chosen.web_port) in note
        with pytest.raises(PortInUse, match="RETRO_WEB_PORT"):
            choose_web_port(Settings(web_port=port), user_chose=True)  # keep it or refuse
    free = Settings(web_port=chosen.web_port)
    assert choose_web_port(free, user_chose=True) == (free, None)


def test_demo_stops_what_it_started_even_after_the_worker_died() -> None:
    """The worker already exited (its port was taken): the broker still stops."""
    from streams.dev.demo import _Started

    class Broker:
        stops = 0

        def stop(self) -> bool:
            self.stops += 1
            return True

    started = _Started()
    started.worker = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    started.worker.wait()  # reaped: its process group is gone, killpg would raise
    started.broker = Broker()  # type: ignore[assignment]
    said: list[str] = []
    started.stop(keep=False, say=said.append)
    assert started.broker.stops == 1  # type: ignore[union-attr]
    assert said == ["stopped the worker and the broker"]


def test_a_worker_that_died_is_explained_by_its_last_error_line(tmp_path: Path) -> None:
    from streams.dev.demo import worker_failure

    log = ("2026-01-01 INFO faust: starting\nTraceback (most recent call last):\n"
           '  File "x.py", line 1, in <module>\nOSError: [Errno 99] Cannot assign requested '
           "address\n2026-01-01 INFO faust: stopped\n")
    error = worker_failure(log, 1, 6066, tmp_path / "w.log")
    assert str(error) == ("the worker exited with code 1: OSError: [Errno 99] Cannot assign "
                          f"requested address (whole log: {tmp_path / 'w.log'})")
    assert isinstance(worker_failure("OSError: address already in use", 1, 6066,
                                     tmp_path / "w.log"), PortInUse)
    assert str(worker_failure("", 3, 6066, tmp_path / "w.log")).startswith(
        "the worker exited with code 3 (whole log")


def test_worker_refuses_a_web_port_in_use(retro: Callable[..., Run]) -> None:
    with busy_port() as port:
        retro("worker", RETRO_WEB_PORT=str(port)).one_line_error(
            PortInUse.exit_code, str(port), "RETRO_WEB_PORT")


def test_an_unreachable_bootstrap_names_the_address_quickly() -> None:
    with closed_port() as port:
        began = time.monotonic()
        proc = retro_process("--bootstrap", f"127.0.0.1:{port}", "audit")
        took = time.monotonic() - began
    Run(proc.returncode, proc.stdout, proc.stderr).one_line_error(
        KafkaUnreachable.exit_code, f"127.0.0.1:{port}", "connection refused",
        "RETRO_KAFKA__BOOTSTRAP")
    assert "Unclosed" not in proc.stderr
    assert took < 15


def test_a_malformed_bootstrap_is_a_config_error(retro: Callable[..., Run]) -> None:
    retro("--bootstrap", "kafka:x", "report").one_line_error(
        ConfigError.exit_code, "'kafka:x'", "host:port")


def test_a_closed_pipe_ends_retro_clean_quietly(tmp_path: Path) -> None:
    """`retro clean ... | head`: the reader leaves early; no BrokenPipeError traceback."""
    from streams.dev.sample import write_sample

    paths = [str(p) for p in write_sample(tmp_path / "s", records=2000)]
    proc = subprocess.Popen([sys.executable, "-m", "streams", "clean", *paths],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=CLEAN_ENV)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"{")
    proc.stdout.close()  # what `head -1` does after its line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == EXIT_BROKEN_PIPE
    assert err == ""


def test_a_bad_setting_is_one_line(retro: Callable[..., Run], tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("2026-01-01 ERROR disk full\n")
    retro("clean", str(log), RETRO_WEB_PORT="abc").one_line_error(
        ConfigError.exit_code, "RETRO_WEB_PORT", "'abc'")
    retro("--set", "fast.input_budget", "clean", str(log)).one_line_error(
        UsageError.exit_code, "--set")


@pytest.mark.parametrize("command", [["demo"], ["worker"], ["broker", "start"], ["topics"],
                                     ["produce", "-"], ["report"], ["audit"]])
def test_a_bad_setting_stops_every_command_before_anything_starts(
        retro: Callable[..., Run], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        command: list[str]) -> None:
    """RETRO_WEB_PORT=0 once started a broker and then a worker that died in faust."""
    from streams.dev.broker.launcher import LocalBroker

    started: list[str] = []
    monkeypatch.setattr(LocalBroker, "start", lambda *a, **k: started.append("broker"))
    monkeypatch.setattr("streams.runner.run_worker", lambda *a, **k: started.append("worker"))
    monkeypatch.setattr("streams.kafka.connect.check_reachable",
                        lambda *a, **k: started.append("kafka"))
    retro(*command, RETRO_WEB_PORT="0").one_line_error(
        ConfigError.exit_code, "RETRO_WEB_PORT='0'", "1 to 65535", "--set web_port=")
    assert started == []
    assert not (tmp_path / "state").exists()


# ------------------------------------------------------------------------- help
def _all_parsers() -> list[argparse.ArgumentParser]:
    root = make_parser()
    subs = [a for a in root._actions if isinstance(a, argparse._SubParsersAction)]
    return [root, *subs[0].choices.values()]


def test_every_option_and_command_has_help() -> None:
    for parser in _all_parsers():
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                assert all(c.help for c in action._choices_actions)
                continue
            assert action.help, f"{parser.prog} {action.dest} has no help text"


def test_help_speaks_to_users() -> None:
    text = make_parser().format_help()
    assert "Settings once" not in text
    for words in ("post-mortem", "retro demo", "retro deadletter", "Exit codes"):
        assert words in text
    demo = dict((p.prog, p) for p in _all_parsers())["retro demo"]
    data = next(a for a in demo._actions if a.dest == "data")
    assert data.help is not None and "comma-separated" in data.help


def test_a_redrive_refused_the_raw_topic_for_old_reviews_still_sends_the_rest(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Reviews with lane coordinates go back from the lanes; those without can only come
    from the raw topic, and a user who may not read it is told so in one line once the
    rest is sent (against a real broker: tests/integration/test_redrive_by_hand.py)."""
    from streams import cli
    from streams.errors import NotAuthorized
    from streams.intervals import Coverage
    from streams.report.ops import redrive, reviews

    async def read_reviews(settings: object) -> tuple[list[object], Coverage, int]:
        return [], Coverage(), 0

    async def redrive_parked(settings: object, chosen: object) -> redrive.Redriven:
        return redrive.Redriven(7, NotAuthorized("3 parked records are in reviews without "
                                                 "lane coordinates, and ..."))

    monkeypatch.setattr(reviews, "read_reviews", read_reviews)
    monkeypatch.setattr(reviews, "parked_reviews", lambda *args: ["a review"])
    monkeypatch.setattr(redrive, "redrive_parked", redrive_parked)
    monkeypatch.setattr(cli, "kafka", lambda settings: None)
    assert cli.main(["review", "--redrive"]) == NotAuthorized.exit_code
    out, err = capsys.readouterr()
    assert out.startswith("re-drove 7 parked records (every reason) to the lanes")
    assert err.count("\n") == 1 and "3 parked records are in reviews without lane" in err


def test_fake_llm_flags_left_out_keep_the_providers_defaults() -> None:
    known = {f.name for f in fields(FakeLLMConfig)}
    assert set(FAKE_LLM_FIELDS) <= known
    bare = make_parser().parse_args(["fake-llm"])
    assert all(getattr(bare, name) is None for name in FAKE_LLM_FIELDS)
    given = make_parser().parse_args(["fake-llm", "--window-seconds", "10", "--seed", "3"])
    assert {n: getattr(given, n) for n in FAKE_LLM_FIELDS if getattr(given, n) is not None
            } == {"window_seconds": 10.0, "seed": 3}
