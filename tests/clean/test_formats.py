"""Format detection and parsing: one case per format and layout, plus timestamp rules."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from streams.clean.formats import FormatParser, Parsed
from streams.clean.levels import normalize_level, syslog_severity
from streams.clean.timestamps import match_leading
from streams.errors import ConfigError
from streams.records import iso_utc

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def logger(p: Any) -> str | None:
    """The logger a header named: kept as an attribute, never as the service."""
    return p.attributes.get("logger")


def parser(*, year: int | None = None, zone: str = "UTC", now: datetime = NOW) -> FormatParser:
    return FormatParser(default_year=year, default_timezone=zone, clock=lambda: now)


def parse(text: str, **kwargs: object) -> Parsed:
    return parser(**kwargs).parse(text)  # type: ignore[arg-type]


def ts(p: Parsed) -> str | None:
    return iso_utc(p.timestamp) if p.timestamp else None


# --- JSON ---------------------------------------------------------------------------


def test_json_common_keys() -> None:
    p = parse(
        '{"ts": "2024-03-01T10:00:00.123+02:00", "level": "warning", "msg": "disk almost full",'
        ' "service": "api", "disk": "/dev/sda1"}'
    )
    assert (p.format, ts(p), p.timestamp_rule) == ("json", "2024-03-01T08:00:00.123Z", None)
    assert (p.level, p.service, p.message) == ("WARN", "api", "disk almost full")
    assert p.attributes == {"disk": "/dev/sda1"}


def test_json_epoch_millis_dotted_level_and_ecs_service() -> None:
    p = parse(
        '{"@timestamp": 1709287200123, "log.level": "ERROR", "message": "boom",'
        ' "service": {"name": "billing"}}'
    )
    assert ts(p) == "2024-03-01T10:00:00.123Z"
    assert (p.level, p.service, p.message) == ("ERROR", "billing", "boom")
    assert p.attributes == {}


def test_json_numeric_pino_level_and_seconds_epoch() -> None:
    p = parse('{"time": 1709287200, "level": 50, "msg": "failed", "logger": "db"}')
    assert (ts(p), p.level, p.service) == ("2024-03-01T10:00:00.000Z", "ERROR", None)
    assert p.attributes["logger"] == "db"  # a logger is evidence inside a service


def test_json_without_message_key_keeps_the_record_as_message() -> None:
    text = '{"timestamp": "2024-03-01 10:00:00", "severity": "info", "user": "bob"}'
    p = parse(text)
    assert p.message == text
    assert p.timestamp_rule == "zone-assumed:UTC"
    assert p.attributes == {"user": "bob"}


@pytest.mark.parametrize("text", ["{not json at all", "[1, 2, 3]", '"just a string"'])
def test_broken_or_non_object_json_is_text(text: str) -> None:
    p = parse(text)
    assert p.format == "text"
    assert p.message == text


# --- Docker json-file ----------------------------------------------------------------

NEZHA = (
    '{"log":"17:26:48.079 WARN  o.s.OrderServiceImpl#361 TraceID: c0ad SpanID: fa58 '
    '[getOrderById][Get Order By ID Fail]\\n","stream":"stdout",'
    '"time":"2023-01-29T09:26:48.079928222Z"}'
)


def test_docker_time_of_day_takes_date_and_zone_from_the_wrapper() -> None:
    p = parse(NEZHA)
    assert p.format == "docker"
    # inner clock is UTC+8 (17:26 local == 09:26Z): the app's milliseconds are kept
    assert ts(p) == "2023-01-29T09:26:48.079Z"
    assert p.timestamp_rule == "date-from-wrapper"
    assert (p.level, logger(p)) == ("WARN", "o.s.OrderServiceImpl")
    assert p.message.startswith("TraceID: c0ad")
    assert p.attributes["stream"] == "stdout"
    assert p.attributes["inner_format"] == "log4j"
    assert p.attributes["line"] == 361


def test_docker_wrapper_across_midnight_picks_the_nearest_date() -> None:
    line = json.dumps(
        {
            "log": "00:00:00.500 INFO x.Y done\n",
            "stream": "stdout",
            "time": "2023-01-28T16:00:00.6Z",
        }
    )
    assert ts(parse(line)) == "2023-01-28T16:00:00.500Z"  # 00:00 on the 29th at UTC+8


def test_docker_inner_json() -> None:
    line = json.dumps(
        {
            "log": '{"level":"error","msg":"inner"}\n',
            "stream": "stderr",
            "time": "2023-01-29T09:26:48Z",
        }
    )
    p = parse(line)
    assert (p.format, p.level, p.message) == ("docker", "ERROR", "inner")
    assert (ts(p), p.timestamp_rule) == ("2023-01-29T09:26:48.000Z", None)
    assert p.attributes == {"inner_format": "json", "stream": "stderr"}


def test_docker_plain_text_uses_the_wrapper_time() -> None:
    line = json.dumps({"log": "hello\n", "stream": "stdout", "time": "2023-01-29T09:26:48.1Z"})
    p = parse(line)
    assert (ts(p), p.timestamp_rule, p.message, p.level) == (
        "2023-01-29T09:26:48.100Z",
        None,
        "hello",
        None,
    )


def test_docker_zone_less_inner_date_takes_the_zone_from_the_wrapper() -> None:
    line = json.dumps(
        {
            "log": "2023-01-29 17:26:48.079 ERROR [main] com.x.Foo: bad\n",
            "stream": "stdout",
            "time": "2023-01-29T09:26:48.080Z",
        }
    )
    p = parse(line)
    assert (ts(p), p.timestamp_rule) == ("2023-01-29T09:26:48.079Z", "zone-from-wrapper")
    assert (p.level, logger(p), p.message) == ("ERROR", "com.x.Foo", "bad")


# --- logfmt --------------------------------------------------------------------------


def test_logfmt_with_quotes_and_escapes() -> None:
    p = parse('time="2024-03-01T10:00:00Z" level=error msg="failed \\"x\\"" service=api err=eof')
    assert (p.format, ts(p), p.level) == ("logfmt", "2024-03-01T10:00:00.000Z", "ERROR")
    assert (p.service, p.message, p.attributes) == ("api", 'failed "x"', {"err": "eof"})


def test_a_single_pair_is_not_logfmt() -> None:
    assert parse("status=ok").format == "text"


# --- log4j family ---------------------------------------------------------------------


def test_log4j_thread_and_logger_hadoop() -> None:
    p = parse(
        "2015-10-18 18:01:47,978 INFO [main] org.apache.hadoop.mapreduce.v2.app.MRAppMaster: "
        "Created MRAppMaster for application appattempt_1445144423722_0020_000001"
    )
    assert (p.format, ts(p), p.level) == ("log4j", "2015-10-18T18:01:47.978Z", "INFO")
    assert p.service is None  # the logger is no service: the source names it
    assert p.attributes == {"thread": "main",
                            "logger": "org.apache.hadoop.mapreduce.v2.app.MRAppMaster"}
    assert p.message.startswith("Created MRAppMaster")


def test_log4j_bracketed_date_kafka_with_trailing_logger() -> None:
    p = parse(
        "[2016-12-19 20:39:48,918] WARN [ReplicaFetcherThread-0-2], Error in fetch "
        "(kafka.server.ReplicaFetcherThread)\njava.io.IOException: gone\n\tat a.b(C.scala:1)"
    )
    assert (p.format, ts(p), p.level) == ("log4j", "2016-12-19T20:39:48.918Z", "WARN")
    assert logger(p) == "kafka.server.ReplicaFetcherThread"
    assert p.message == (
        "[ReplicaFetcherThread-0-2], Error in fetch\njava.io.IOException: gone\n\tat a.b(C.scala:1)"
    )


def test_log4j_dash_separated_zookeeper() -> None:
    p = parse(
        "2015-07-29 17:41:44,747 - INFO  [QuorumPeer[myid=1]/0:0:0:0:0:0:0:0:2181:"
        "FastLeaderElection@774] - Notification time out: 3200"
    )
    assert (p.format, p.level, logger(p)) == ("log4j", "INFO", "FastLeaderElection")
    assert p.message == "Notification time out: 3200"
    assert p.attributes == {"line": 774, "thread": "QuorumPeer[myid=1]/0:0:0:0:0:0:0:0:2181",
                            "logger": "FastLeaderElection"}


def test_spring_boot_layout() -> None:
    p = parse(
        "2023-01-29 17:26:48.079  INFO 1 --- [           main] "
        "o.s.b.w.e.tomcat.TomcatWebServer  : Tomcat started"
    )
    assert (p.format, p.level, logger(p), p.message) == (
        "log4j",
        "INFO",
        "o.s.b.w.e.tomcat.TomcatWebServer",
        "Tomcat started",
    )
    assert p.attributes == {"pid": 1, "thread": "main",
                            "logger": "o.s.b.w.e.tomcat.TomcatWebServer"}


def test_python_logging_layout() -> None:
    p = parse("2023-01-29 17:26:48,079 - myapp.db - WARNING - slow query")
    assert (p.format, p.level, logger(p), p.message) == ("log4j", "WARN", "myapp.db", "slow query")


def test_time_of_day_only_outside_a_wrapper_has_no_timestamp_but_keeps_the_time() -> None:
    p = parse("17:26:48.079 [main] DEBUG com.example.App - Starting")
    assert (p.timestamp, p.level, logger(p), p.message) == (
        None,
        "DEBUG",
        "com.example.App",
        "Starting",
    )
    assert p.attributes["time_of_day"] == "17:26:48.079"


def test_a_capitalised_first_word_is_message_not_level() -> None:
    p = parse("2024-01-01 10:00:00 Error while reading config")
    assert p.level is None
    assert p.message == "Error while reading config"


# --- syslog ---------------------------------------------------------------------------


def test_rfc3164_linux_line_with_year_rule() -> None:
    p = parse(
        "Jun 14 15:16:01 combo sshd(pam_unix)[19939]: authentication failure; rhost=218.188.2.4",
        now=datetime(2026, 11, 29, tzinfo=UTC),
    )
    assert (p.format, ts(p)) == ("syslog", "2026-06-14T15:16:01.000Z")
    assert p.timestamp_rule == "year-assumed:2026,zone-assumed:UTC"
    assert (p.service, p.level) == ("sshd(pam_unix)", None)
    assert p.attributes == {"host": "combo", "pid": 19939}
    assert p.message == "authentication failure; rhost=218.188.2.4"


def test_rfc3164_year_rolls_back_when_it_would_be_in_the_future() -> None:
    p = parse("Dec 31 23:59:59 host cron[12]: late", now=datetime(2026, 1, 1, 0, 30, tzinfo=UTC))
    assert ts(p) == "2025-12-31T23:59:59.000Z"
    assert p.timestamp_rule == "year-assumed:2025,zone-assumed:UTC"
    # within a day ahead (clock skew) is kept in the current year
    p = parse("Jan 02 00:00:00 host cron[12]: soon", now=datetime(2026, 1, 1, 12, tzinfo=UTC))
    assert ts(p) == "2026-01-02T00:00:00.000Z"


def test_configured_default_year_is_used_as_given() -> None:
    p = parse("Dec 31 23:59:59 host cron: x", year=2031)
    assert p.timestamp_rule == "year-assumed:2031,zone-assumed:UTC"
    assert ts(p) == "2031-12-31T23:59:59.000Z"


def test_feb_29_without_a_year_lands_in_a_leap_year() -> None:
    p = parse("Feb 29 10:00:00 host app: leap", now=datetime(2026, 6, 1, tzinfo=UTC))
    assert ts(p) == "2024-02-29T10:00:00.000Z"
    assert p.timestamp_rule == "year-assumed:2024,zone-assumed:UTC"


def test_rfc3164_with_pri_and_unusual_tag() -> None:
    p = parse("<34>Oct 11 22:14:15 mymachine su: 'su root' failed")
    assert (p.format, p.level, p.service) == ("syslog", "FATAL", "su")  # severity 2: crit
    assert p.attributes == {"host": "mymachine", "facility": 4}
    p = parse("Jun 19 04:09:11 combo syslogd 1.4.1: restart.")
    assert (p.format, p.attributes, p.message) == (
        "syslog",
        {"host": "combo"},
        "syslogd 1.4.1: restart.",
    )


def test_rfc5424_with_structured_data() -> None:
    p = parse(
        "<165>1 2003-08-24T05:14:15.000003-07:00 192.0.2.1 myproc 8710 - "
        '[exampleSDID@32473 iut="3" eventSource="App"] \ufeffAn application event'
    )
    assert (p.format, ts(p), p.timestamp_rule) == ("syslog", "2003-08-24T12:14:15.000Z", None)
    assert (p.level, p.service, p.message) == ("NOTICE", "myproc", "An application event")
    assert p.attributes["procid"] == 8710
    assert p.attributes["sd"].startswith("[exampleSDID@32473")


# --- delimited ------------------------------------------------------------------------


def test_pipe_delimited_healthapp() -> None:
    p = parse("20171223-22:15:29:606|Step_LSC|30002312|onStandStepChanged 3579")
    assert (p.format, ts(p), p.service) == ("delimited", "2017-12-23T22:15:29.606Z", "Step_LSC")
    assert (p.message, p.attributes) == ("onStandStepChanged 3579", {"pid": 30002312})


def test_unpadded_healthapp_time_reads_the_last_field_as_milliseconds() -> None:
    p = parse("20171223-23:7:6:86|Step_LSC|30002312|onExtend:1514041626000 0 0")
    assert ts(p) == "2017-12-23T23:07:06.086Z"
    assert p.message == "onExtend:1514041626000 0 0"


def test_comma_and_tab_delimited() -> None:
    p = parse("2017-01-01 00:00:00,ERROR,api,User failed, retry")
    assert (p.format, p.level, p.service, p.message) == (
        "delimited",
        "ERROR",
        "api",
        "User failed, retry",
    )
    p = parse("2017-01-01T00:00:00Z\tINFO\tworker\tjob done")
    assert (p.format, p.level, p.service, p.message) == ("delimited", "INFO", "worker", "job done")


# --- bare text layouts ----------------------------------------------------------------


def test_apache_error_log() -> None:
    p = parse(
        "[Sun Dec 04 04:47:44 2005] [notice] workerEnv.init() ok /etc/httpd/conf/w.properties"
    )
    assert (p.format, ts(p), p.level) == ("text", "2005-12-04T04:47:44.000Z", "NOTICE")
    assert p.message == "workerEnv.init() ok /etc/httpd/conf/w.properties"
    assert p.service is None


def test_a_trailing_file_name_in_parentheses_is_not_a_logger_outside_log4j() -> None:
    p = parse("[Sun Dec 04 04:47:44 2005] [error] File does not exist (index.html)")
    assert (p.service, p.message) == (None, "File does not exist (index.html)")


def test_apache_24_module_level() -> None:
    p = parse(
        "[Fri Sep 09 10:42:29.902022 2011] [core:error] [pid 35708:tid 4328636416] "
        "File does not exist"
    )
    assert (ts(p), p.level, p.service) == ("2011-09-09T10:42:29.902Z", "ERROR", "core")
    assert p.message == "[pid 35708:tid 4328636416] File does not exist"


def test_hdfs() -> None:
    p = parse(
        "081109 203615 148 INFO dfs.DataNode$PacketResponder: PacketResponder 1 for block "
        "blk_38865049064139660 terminating"
    )
    assert (p.format, ts(p), p.level) == ("text", "2008-11-09T20:36:15.000Z", "INFO")
    assert (p.service, p.attributes) == (None, {"pid": 148,
                                                "logger": "dfs.DataNode$PacketResponder"})
    assert p.message.startswith("PacketResponder 1")


@pytest.mark.parametrize(
    ("label", "level", "expected"),
    [
        ("-", "INFO", "INFO"),
        ("KERNDTLB", "FATAL", "FATAL"),
        ("-", "SEVERE", "ERROR"),
        ("-", "FAILURE", "FATAL"),
        ("-", "WARNING", "WARN"),
    ],
)
def test_bgl_uses_the_epoch_as_utc(label: str, level: str, expected: str) -> None:
    # no rule names this layout: the epoch column, the level column and the name before
    # it are learned from the source's lines (streams.clean.infer), one line is enough
    p = parser().parse(
        f"{label} 1117838570 2005.06.03 R02-M1-N0-C:J12-U11 2005-06-03-15.42.50.675872 "
        f"R02-M1-N0-C:J12-U11 RAS KERNEL {level} instruction cache parity error corrected",
        source="bgl",
    )
    # the epoch is UTC; the local time column (PDT, 15:42) only lends its microseconds
    assert (p.format, ts(p), p.timestamp_rule) == ("text", "2005-06-03T22:42:50.675Z", None)
    assert (p.level, p.service) == (expected, "KERNEL")
    assert p.attributes["header"].startswith(f"{label} 2005.06.03 R02-M1-N0-C:J12-U11")
    assert p.message == "instruction cache parity error corrected"


def test_openstack_prefix_pid_logger_and_request_context() -> None:
    # the timestamp after a file-name field is found by the source's learned structure,
    # then the usual header grammar reads pid, level, logger and context after it
    p = parser().parse(
        "nova-api.log.1.2017-05-16_13:53:08 2017-05-16 00:00:00.008 25746 INFO "
        "nova.osapi_compute.wsgi.server [req-38101a0b 113d3a99 54fadb41 - - -] 10.11.10.1 "
        '"GET /v2/servers/detail HTTP/1.1" status: 200',
        source="nova-api",
    )
    assert (p.format, ts(p), p.level) == ("text", "2017-05-16T00:00:00.008Z", "INFO")
    assert logger(p) == "nova.osapi_compute.wsgi.server"
    assert p.attributes == {
        "prefix": "nova-api.log.1.2017-05-16_13:53:08",
        "pid": 25746,
        "context": "req-38101a0b 113d3a99 54fadb41 - - -",
        "logger": "nova.osapi_compute.wsgi.server",
    }
    assert p.message.startswith("10.11.10.1")


def test_glog() -> None:
    p = parse("I0129 17:26:48.079123    1234 server.go:123] Serving", now=NOW)
    assert (p.format, p.level, p.message) == ("text", "INFO", "Serving")
    assert ts(p) == "2026-01-29T17:26:48.079Z"
    assert p.attributes == {"pid": 1234, "file": "server.go", "line": 123}


def test_level_first_and_plain_prose() -> None:
    p = parse("[WARN] careful now")
    assert (p.level, p.message, p.timestamp) == ("WARN", "careful now", None)
    p = parse("ERROR something broke")
    assert (p.level, p.message) == ("ERROR", "something broke")
    p = parse("just some prose with no structure")
    assert (p.format, p.level, p.timestamp, p.message) == (
        "text",
        None,
        None,
        "just some prose with no structure",
    )


def test_other_timestamp_layouts() -> None:
    assert ts(parse("29/Jan/2023:17:26:48 +0800 hello")) == "2023-01-29T09:26:48.000Z"
    assert ts(parse("Sun, 04 Dec 2005 04:47:44 +0000 msg")) == "2005-12-04T04:47:44.000Z"
    p = parse("20171223T221529Z basic ISO")
    assert (ts(p), p.timestamp_rule) == ("2017-12-23T22:15:29.000Z", None)


def test_multi_line_record_keeps_the_header_of_the_first_line() -> None:
    p = parse("2024-01-01 10:00:00,000 ERROR [t] a.B: failed\nline two\n\tat x.y(Z.java:1)")
    assert (p.level, logger(p)) == ("ERROR", "a.B")
    assert p.message == "failed\nline two\n\tat x.y(Z.java:1)"


def test_empty_text() -> None:
    assert parse("") == Parsed("text", "")


# --- timestamp rules -------------------------------------------------------------------


def test_zone_assumed_uses_the_configured_zone_with_dst() -> None:
    summer = parse("2024-07-01 12:00:00 INFO x", zone="Europe/Paris")
    winter = parse("2024-01-01 12:00:00 INFO x", zone="Europe/Paris")
    assert (ts(summer), summer.timestamp_rule) == (
        "2024-07-01T10:00:00.000Z",
        "zone-assumed:Europe/Paris",
    )
    assert ts(winter) == "2024-01-01T11:00:00.000Z"


def test_stated_zone_needs_no_rule() -> None:
    p = parse("2016-12-19 20:39:48 +0100 WARN with zone", zone="Asia/Tokyo")
    assert (ts(p), p.timestamp_rule) == ("2016-12-19T19:39:48.000Z", None)


def test_impossible_dates_are_not_timestamps() -> None:
    p = parse("2024-13-45 10:00:00 INFO x")
    assert p.timestamp is None
    p = parse("2024-02-30 10:00:00 INFO x")
    assert p.timestamp is None


def test_unknown_zone_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="RETRO_CLEAN__DEFAULT_TIMEZONE"):
        parser(zone="Mars/Olympus")


def test_iso_utc_is_fixed_width() -> None:
    assert iso_utc(datetime(5, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)) == "0005-01-02T03:04:05.678Z"
    assert match_leading("no time here") is None


# --- levels ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "level"),
    [
        ("warning", "WARN"),
        ("WARN", "WARN"),
        ("err", "ERROR"),
        ("Error", "ERROR"),
        ("severe", "ERROR"),
        ("crit", "FATAL"),
        ("critical", "FATAL"),
        ("alert", "FATAL"),
        ("emerg", "FATAL"),
        ("fatal", "FATAL"),
        ("panic", "FATAL"),
        ("FAILURE", "FATAL"),
        ("notice", "NOTICE"),
        ("trace", "TRACE"),
        ("debug", "DEBUG"),
        ("info", "INFO"),
        (3, "ERROR"),
        (6, "INFO"),
        ("4", "WARN"),
        (30, "INFO"),
        (60, "FATAL"),
        ("bogus", None),
        (True, None),
        (None, None),
        (99, None),
    ],
)
def test_normalize_level(raw: object, level: str | None) -> None:
    assert normalize_level(raw) == level


def test_syslog_severities() -> None:
    assert [syslog_severity(i) for i in range(8)] == [
        "FATAL",
        "FATAL",
        "FATAL",
        "ERROR",
        "WARN",
        "NOTICE",
        "INFO",
        "DEBUG",
    ]
    assert syslog_severity(8) is None
