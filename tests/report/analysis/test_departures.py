"""Departures from the stream's own baseline: each rule with a pair, "this departs, this
similar one does not", on series built by hand."""

from __future__ import annotations

import math
import re

import pytest

from streams.records import template_head
from streams.report.analysis.departures import (
    Departure,
    Findings,
    Walk,
    _binomial_lower,
    _binomial_upper,
    find_departures,
)
from streams.report.analysis.incidents import find_incidents, find_unjudged
from streams.report.state.hops import NextLinesTable
from streams.report.state.model import OTHER_TEMPLATES, Series

HOUR = [f"2026-11-29T10:{m:02d}" for m in range(60)]


def steady(n: int, minutes: list[str] = HOUR) -> dict[str, int]:
    return dict.fromkeys(minutes, n)


def table(**services: dict[str, Series]) -> dict[str, dict[str, Series]]:
    return {name.replace("_", "-"): templates for name, templates in services.items()}


def background() -> dict[str, dict[str, Series]]:
    """Two services that log steadily all hour, one with a chronic error."""
    return table(
        api={"GET /orders done": Series(level="INFO", minutes=steady(40))},
        db={"query ok": Series(level="INFO", minutes=steady(30)),
            "slow query warning": Series(level="WARN", minutes=steady(2))},
    )


def kinds(series: dict[str, dict[str, Series]]) -> set[tuple[str, str]]:
    return {(d.service, d.kind) for d in find_departures(series).departures}


def test_a_new_error_line_departs_and_an_old_one_does_not() -> None:
    series = background()
    late = {m: 6 for m in HOUR[40:45]}
    series["api"]["payment call failed"] = Series(level="ERROR", minutes=late)
    assert ("api", "new") in kinds(series)
    # the same line present all along, at the same rate, is chronic, never new
    series["api"]["payment call failed"] = Series(level="ERROR", minutes=steady(6))
    found = find_departures(series)
    assert ("api", "payment call failed") in found.chronic
    assert not [d for d in found.departures if d.template == "payment call failed"]


def test_a_chronic_line_that_bursts_departs_and_one_that_wobbles_does_not() -> None:
    series = background()  # db warns of a slow query twice a minute all hour
    wobbled = {**steady(2), HOUR[50]: 5}
    series["db"]["slow query warning"] = Series(level="WARN", minutes=wobbled)
    found = find_departures(series)
    assert ("db", "slow query warning") in found.chronic and not found.departures
    # background while it keeps its rate: ten times it is a departure still
    burst = {**steady(2), HOUR[50]: 20}
    series["db"]["slow query warning"] = Series(level="WARN", minutes=burst)
    found = find_departures(series)
    assert ("db", "slow query warning") in found.chronic
    assert [(d.service, d.kind, d.minute) for d in found.departures] == [
        ("db", "burst", HOUR[50])]


def test_a_line_too_early_to_call_new_that_goes_on_every_minute_becomes_background(
        ) -> None:
    # judged from the second minute on: three records against a one-minute baseline of
    # half its volume cannot prove new, and one a minute after that never will
    busy = {**steady(200), HOUR[0]: 100}
    series = {"api": {"GET /orders done": Series(level="INFO", minutes=busy),
                      "retry scheduled": Series(level="ERROR", minutes={
                          HOUR[1]: 3, **steady(1, HOUR[2:])})}}
    found = find_departures(series)
    assert not found.departures
    assert found.chronic == [("api", "retry scheduled")]  # learned once it stayed
    # gone after its first minute: nothing to learn, never background
    series["api"]["retry scheduled"] = Series(level="ERROR", minutes={HOUR[1]: 3})
    found = find_departures(series)
    assert not found.departures and not found.chronic


def test_a_new_error_that_slows_to_two_a_minute_goes_on_and_one_that_began_so_does_not(
) -> None:
    series = background()
    slowing = {HOUR[40]: 6, **{m: 2 for m in HOUR[41:49]}}
    series["api"]["spool write failed"] = Series(level="ERROR", minutes=slowing)
    found = find_departures(series)
    assert [d.minute for d in found.departures] == HOUR[40:49]
    incidents = find_incidents(found)
    assert [(i.started, i.ended) for i in incidents] == [
        ("2026-11-29T10:40:00Z", "2026-11-29T10:49:00Z")]
    # never more than two a minute: it never reached the count a new line needs
    series["api"]["spool write failed"] = Series(level="ERROR",
                                                 minutes={m: 2 for m in HOUR[40:49]})
    assert kinds(series) == set()


def calls_into(service: str, usual: list[int], slow: dict[int, list[int]]
               ) -> dict[str, dict[str, dict[str, int]]]:
    """Hops into ``service`` (``Report.hops``): each minute ``usual`` bins, except the
    minutes of ``slow`` (by index in HOUR)."""
    return {service: {minute: bins(slow.get(i, usual)) for i, minute in enumerate(HOUR)}}


def bins(calls: list[int]) -> dict[str, int]:
    """One minute's hops by delay bin, one call a bin each."""
    return {str(b): calls.count(b) for b in sorted(set(calls))}


def api_and_db(api_usual: list[int], db: dict[str, list[int]]
               ) -> dict[str, dict[str, dict[str, int]]]:
    """api called all hour (``calls_into``), db only in the minutes of ``db``."""
    return calls_into("api", api_usual, {}) | {"db": {m: bins(x) for m, x in db.items()}}


def test_calls_into_a_service_that_take_four_times_longer_depart_and_a_wobble_does_not(
) -> None:
    usual = [6, 6, 7, 5, 6, 8, 6, 7]  # about 8 ms a call, now and then 16
    slowed = calls_into("db", usual, {45: [11, 12, 11, 13, 6, 12, 11, 12]})
    found = find_departures(background(), hops=slowed)
    assert [(d.service, d.kind, d.minute, d.observed) for d in found.departures] == [
        ("db", "slow", HOUR[45], 7)]
    [incident] = find_incidents(found)
    assert (incident.origin, incident.title) == ("db", "db: calls into it slowed")
    # calls into it this slow are its own failure, as its errors would be: medium
    assert incident.severity == "medium"
    # three such calls among thirty-three are a weaker sign: low
    fewer = calls_into("db", usual, {45: [11] * 3 + [6] * 30})
    [incident] = find_incidents(find_departures(background(), hops=fewer))
    assert (incident.origin, incident.severity) == ("db", "low")
    # twice as slow, or four times for two calls in a minute: not enough to tell
    twice = calls_into("db", usual, {45: [8, 8, 9, 7, 8, 10, 8, 9]})
    assert kinds(background()) == set() == {
        (d.service, d.kind) for d in find_departures(background(), hops=twice).departures}
    two = calls_into("db", usual, {45: [11, 12, 6, 6, 7, 5, 6, 8]})
    assert find_departures(background(), hops=two).departures == []


def test_a_seldom_called_service_is_judged_by_the_tail_all_services_share() -> None:
    """Eight calls into db are too few to know its own tail: the other services' calls,
    each against its own median, tell how often a call takes 16x or 64x its usual."""
    def hops(api_usual: list[int], db_slow: list[int]) -> dict[str, dict[str, dict[str, int]]]:
        return api_and_db(api_usual, {m: [6, 7] for m in HOUR[40:44]} | {HOUR[44]: db_slow})

    steady_api = [6, 6, 7, 5, 6, 8, 6, 7]
    noisy_api = [6, 6, 6, 6, 6, 6, 15, 15]  # a quarter of its calls take 16x its usual
    sixteen_times = [15, 15, 15, 6]
    [slow] = find_departures(background(), hops=hops(steady_api, sixteen_times)).departures
    assert (slow.service, slow.kind, slow.observed, slow.times) == ("db", "slow", 3, 16)
    assert find_departures(background(), hops=hops(noisy_api, sixteen_times)).departures == []
    # a hundred times its usual is rare anywhere: it departs beside the noisy one too
    [slow] = find_departures(background(), hops=hops(noisy_api, [20, 20, 20, 6])).departures
    assert (slow.service, slow.observed, slow.times) == ("db", 3, 64)
    # far below one call expected, and said so rather than rounded to 0.0
    assert re.fullmatch(r"slow: 3 calls into it took 64x its usual or longer, "
                        r"0\.0*[1-9]\d* expected", slow.describe())
    # near the median services differ: 4x is judged only on db's own twenty hops
    four_times = [11, 11, 11, 6]
    assert find_departures(background(), hops=hops(steady_api, four_times)).departures == []


def test_two_calls_in_a_baseline_judge_a_call_64x_slower_and_not_one_16x() -> None:
    """A log that begins a minute before a service slows holds two of its calls: their
    median may be a few bins off, which 64x outruns and 16x may not."""
    def hops(usual: list[int], slowed: list[int]) -> dict[str, dict[str, dict[str, int]]]:
        return api_and_db([6, 6, 7, 5, 6, 8, 6, 7], {HOUR[43]: usual, HOUR[44]: slowed})

    [slow] = find_departures(background(), hops=hops([6, 7], [20, 20, 20, 6])).departures
    assert (slow.service, slow.minute, slow.observed, slow.times) == ("db", HOUR[44], 3, 64)
    assert find_departures(background(), hops=hops([6, 7], [15, 15, 15, 6])).departures == []
    assert find_departures(background(), hops=hops([6], [20, 20, 20, 6])).departures == []


def test_slow_calls_too_few_to_tell_wait_outside_the_baseline_a_minute_or_two() -> None:
    """db is called four times a minute. Two calls 100x slower, two minutes running,
    are too few to judge; learned as its usual they would hide the third minute's four.
    Two such calls every minute for ten minutes are its usual after all."""
    def hops(then: list[list[int]]) -> dict[str, dict[str, dict[str, int]]]:
        return api_and_db([6, 6, 7, 5, 6, 8, 6, 7],
                          {HOUR[40 + i]: [6, 7, 6, 7] for i in range(4)}
                          | {HOUR[44 + i]: calls for i, calls in enumerate(then)})

    slowing = [[20, 20, 6, 7], [20, 20, 6, 7], [20, 20, 20, 20]]
    [slow] = find_departures(background(), hops=hops(slowing)).departures
    assert (slow.service, slow.minute, slow.observed, slow.times) == ("db", HOUR[46], 4, 64)
    usual = [[20, 20, 6, 7]] * 10 + [[20, 20, 20, 20]]
    assert find_departures(background(), hops=hops(usual)).departures == []


def test_a_new_routine_line_is_not_a_departure() -> None:
    series = background()
    series["api"]["cache warmed"] = Series(level="INFO", minutes={m: 6 for m in HOUR[40:45]})
    assert kinds(series) == set()


def test_a_burst_departs_and_noise_around_the_mean_does_not() -> None:
    series = background()
    occasional = {m: 1 for m in HOUR[::4]}
    series["api"]["retrying call"] = Series(level="WARN", minutes=occasional)
    assert kinds(series) == set()
    series["api"]["retrying call"] = Series(level="WARN", minutes={**occasional, HOUR[50]: 20})
    assert ("api", "burst") in kinds(series)


def db_cut_short() -> dict[str, dict[str, Series]]:
    """The background, db writing "row returned" after "row fetched" one for one, but
    for three minutes in which it returned early."""
    series = background()
    series["db"]["row fetched"] = Series(level="INFO", minutes=varying())
    thinned = varying()
    for m in HOUR[45:48]:
        thinned[m] = 3
    series["db"]["row returned"] = Series(level="INFO", minutes=thinned)
    return series


def test_a_usual_line_that_thins_out_while_its_partner_goes_on_departs() -> None:
    series = db_cut_short()
    found = find_departures(series)
    thin = [d for d in found.departures if d.kind == "thin"]
    assert {d.template for d in thin} == {"row returned"}
    assert {d.minute for d in thin} == set(HOUR[45:48])
    # a line it stopped writing for three minutes is its own failure, as an error is
    [incident] = find_incidents(found)
    assert (incident.origin, incident.title, incident.severity) == (
        "db", "db: a usual line thins out", "medium")
    # one such minute is a weaker sign: low
    once = varying()
    once[HOUR[45]] = 3
    series["db"]["row returned"] = Series(level="INFO", minutes=once)
    [incident] = find_incidents(find_departures(series))
    assert (incident.origin, incident.severity) == ("db", "low")


def varying() -> dict[str, int]:
    """Requests of one path per minute: they vary, so a partner is told by moving with it."""
    return {m: 20 + (i * 7) % 11 for i, m in enumerate(HOUR)}


def test_a_callers_generic_error_points_by_trace_at_the_callee_that_departed() -> None:
    """api's "500" names no one; its failed requests' traces show db called last, in
    the minutes db cut its answers short."""
    series = db_cut_short()
    series["api"]["Request <UUID> failed: 500 Internal Server Error"] = Series(
        level="ERROR", minutes={m: 8 for m in HOUR[45:48]})

    def origins(failed: dict[str, dict[str, dict[str, int]]] | None
                ) -> list[tuple[str, list[str]]]:
        found = find_departures(series, failed_calls=failed)
        return sorted((i.origin, i.callers) for i in find_incidents(found))

    by_db = {"api": {"db": {m: 8 for m in HOUR[45:48]}}}
    assert origins(by_db) == [("db", ["api"])]
    # the caller's evidence says why it is db's
    [incident] = find_incidents(find_departures(series, failed_calls=by_db))
    api = next(d for d in incident.evidence if d.service == "api")
    # its new line's first minute, 10:45, and the minutes around it: 10:44 had none
    assert api.describe() == ("new line, 8 in its first minute; 16 of its 16 failed "
                              "requests called db last")
    # without traces, or with most failed requests calling another service last, api's
    # failure is its own; so is a link to db in two lone requests
    assert origins(None) == [("api", []), ("db", [])]
    split = {"api": {"db": {m: 3 for m in HOUR[45:48]}, "cache": {m: 5 for m in HOUR[45:48]}}}
    assert origins(split) == [("api", []), ("db", [])]
    assert origins({"api": {"db": {HOUR[45]: 1}}}) == [("api", []), ("db", [])]
    # a callee called last that did not depart is just the last call of a failing service
    series["db"]["row returned"] = Series(level="INFO", minutes=varying())
    assert origins(by_db) == [("api", [])]


def test_a_line_that_falls_with_its_partner_is_load_not_a_thinning() -> None:
    series = background()
    fetched, returned = varying(), varying()
    for m in HOUR[45:48]:  # both lines fall together: fewer requests, none cut short
        fetched[m] = returned[m] = 15
    series["db"]["row fetched"] = Series(level="INFO", minutes=fetched)
    series["db"]["row returned"] = Series(level="INFO", minutes=returned)
    assert not [d for d in find_departures(series).departures if d.kind == "thin"]


def test_a_service_that_goes_quiet_departs_and_one_that_dips_does_not() -> None:
    series = background()
    dipped = steady(30)
    dipped[HOUR[50]] = 22
    series["db"]["query ok"] = Series(level="INFO", minutes=dipped)
    assert kinds(series) == set()
    dipped[HOUR[50]] = 0
    series["db"]["query ok"] = Series(level="INFO", minutes=dipped)
    assert ("db", "quiet") in kinds(series)


def request_lines(requests: dict[str, int], lines: int) -> dict[str, Series]:
    """A service whose every request writes the same ``lines`` lines, once each."""
    return {f"step {n} done": Series(level="INFO", minutes=dict(requests))
            for n in range(lines)}


def test_a_service_of_few_requests_that_serves_none_for_a_minute_is_not_quiet() -> None:
    """Lines come a request's worth at a time: 2 requests a minute of 12 lines each are
    24 lines, but a minute without a request is as likely as Poisson(2) gives, 14%."""
    series = background()
    served = steady(2)
    served[HOUR[50]] = 0
    series["cancel"] = request_lines(served, 12)
    assert ("cancel", "quiet") not in kinds(series)
    # the same volume of single-line requests (24 a minute) falling to none departs
    series["cancel"] = request_lines({**steady(24), HOUR[50]: 0}, 1)
    assert ("cancel", "quiet") in kinds(series)


def test_a_service_of_few_requests_that_stops_for_minutes_is_quiet() -> None:
    """One silent minute of 8 requests is no proof (P = 3e-4); three running are."""
    series = background()
    series["web"] = {"page served": Series(level="INFO", minutes=steady(100))}
    series["cancel"] = request_lines({**steady(8), HOUR[50]: 0}, 12)
    assert ("cancel", "quiet") not in kinds(series)
    series["cancel"] = request_lines({**steady(8), **dict.fromkeys(HOUR[50:53], 0)}, 12)
    found = [d for d in find_departures(series).departures if d.kind == "quiet"]
    assert [(d.service, d.minute) for d in found] == [("cancel", HOUR[52])]


def test_a_service_of_untemplated_lines_alone_is_judged_line_by_line() -> None:
    """Lines no template took say nothing of requests: each counts for one."""
    series = background()
    series["batch"] = {
        OTHER_TEMPLATES: Series(level="INFO", minutes={**steady(30), HOUR[50]: 0}),
        "job started": Series(level="INFO", minutes={HOUR[55]: 1}),
    }
    assert ("batch", "quiet") in kinds(series)


def test_a_service_whose_share_falls_as_others_traffic_swells_is_not_quiet() -> None:
    series = background()
    series["web"] = {"page served": Series(level="INFO", minutes={
        **steady(100), **dict.fromkeys(HOUR[50:53], 600)})}
    # db writes 30 a minute all along: under a quarter of its share, no fewer records
    assert ("db", "quiet") not in kinds(series)
    # the same swell while db falls to 5 a minute
    series["db"]["query ok"] = Series(level="INFO", minutes={
        **steady(30), **dict.fromkeys(HOUR[50:53], 5)})
    assert ("db", "quiet") in kinds(series)


def test_origins_are_services_and_callers_point_at_their_callee() -> None:
    series = background()
    late = {m: 8 for m in HOUR[40:44]}
    # api's failures name db (a service of the records); one also names a word that is
    # no service, and a logger class: neither can become an origin
    series["api"]["no instances available for db"] = Series(
        level="ERROR", minutes=late, named={"db": 32})
    series["api"]["Servlet.service() for servlet threw"] = Series(
        level="ERROR", minutes=late, named={"for": 32, "com.shop.DbClient": 32})
    incidents = find_incidents(find_departures(series))
    origins = {i.origin for i in incidents}
    assert origins <= {"api", "db"}
    db = next(i for i in incidents if i.origin == "db")
    assert db.callers == ["api"]
    assert db.started == "2026-11-29T10:40:00Z"


def test_a_request_path_names_a_service_spelt_without_separators_or_project_prefix(
) -> None:
    """``/api/v1/seatservice/...`` is ts-seat-service's path when several services share
    the "ts" prefix; a spelling two services could have names neither."""
    def origins(named: dict[str, int], *others: str) -> set[str]:
        series = background()
        for name in others:
            series[name] = {"request served": Series(level="INFO", minutes=steady(20))}
        series["api"]["500 Internal Server Error"] = Series(
            level="ERROR", minutes={m: 8 for m in HOUR[40:44]}, named=named)
        return {i.origin for i in find_incidents(find_departures(series))}

    project = ("ts-seat-service", "ts-order-service", "ts-route-service")
    assert origins({"seatservice": 32}, *project) == {"ts-seat-service"}
    assert origins({"OrderService": 32}, *project) == {"ts-order-service"}  # a Feign client
    assert origins({"tsseatservice": 32}, *project) == {"ts-seat-service"}
    # "ts" begins two names only: no project prefix to drop
    assert origins({"seatservice": 32}, *project[:2]) == {"api"}
    # two projects' seat services, both "seatservice" without their prefix: neither
    other = tuple(name.replace("ts-", "tx-") for name in project)
    assert origins({"seatservice": 32}, *project, *other) == {"api"}


def test_a_failure_naming_two_callees_is_the_one_its_services_other_failures_name(
) -> None:
    series = background()
    series["cache"] = {"hit": Series(level="INFO", minutes=steady(20))}
    late = {m: 8 for m in HOUR[40:44]}
    # a client's timeout quotes the gateway's URL and the service behind it, alike
    series["api"]["Post <*> context deadline exceeded"] = Series(
        level="ERROR", minutes=late, named={"cache": 32, "db": 32})
    series["api"]["Read timed out calling db"] = Series(level="ERROR", minutes=late,
                                                        named={"db": 32})
    incidents = find_incidents(find_departures(series))
    assert [(i.origin, i.callers) for i in incidents] == [("db", ["api"])]
    # the other failures naming cache instead: cache's
    del series["api"]["Read timed out calling db"]
    series["api"]["Read timed out calling cache"] = Series(level="ERROR", minutes=late,
                                                           named={"cache": 32})
    incidents = find_incidents(find_departures(series))
    assert [(i.origin, i.callers) for i in incidents] == [("cache", ["api"])]


def test_incidents_apart_in_time_stay_apart() -> None:
    series = background()
    series["api"]["payment call failed"] = Series(
        level="ERROR", minutes={**{m: 6 for m in HOUR[10:12]}, **{m: 6 for m in HOUR[40:42]}})
    incidents = find_incidents(find_departures(series))
    assert sorted(i.started for i in incidents) == [
        "2026-11-29T10:10:00Z", "2026-11-29T10:40:00Z"]


def test_a_callers_generic_error_beside_its_named_timeouts_points_at_the_callee() -> None:
    series = background()
    late = {m: 8 for m in HOUR[40:44]}
    series["api"]["Read timed out calling <*>"] = Series(level="ERROR", minutes=late,
                                                        named={"db": 32})
    series["api"]["Request <UUID> failed: 500 Internal Server Error"] = Series(
        level="ERROR", minutes=late)
    (incident,) = find_incidents(find_departures(series))
    assert (incident.origin, incident.callers) == ("db", ["api"])
    # db logged no failure of its own: it began when its callers first spoke of it
    assert incident.started == "2026-11-29T10:40:00Z"


def test_a_caller_that_goes_quiet_with_its_callee_is_its_impact() -> None:
    series = background()
    # the rest of the system goes on: a whole stream falling at once is a partial minute
    series["web"] = {"page served": Series(level="INFO", minutes=steady(100))}
    series["api"]["GET /orders done"] = Series(
        level="INFO", minutes={**steady(40), **{m: 2 for m in HOUR[45:48]}})
    series["db"]["query ok"] = Series(
        level="INFO", minutes={**steady(30), **{m: 1 for m in HOUR[45:48]}})
    # api's lines named db once (a chronic retry): that is how the logs show who calls whom
    series["api"]["retry against db"] = Series(level="WARN", minutes=steady(1),
                                               named={"db": 60})
    incidents = find_incidents(find_departures(series))
    assert [(i.origin, i.callers) for i in incidents] == [("db", ["api"])]


def test_a_caller_that_goes_quiet_as_a_service_its_requests_reach_slows_is_its_impact(
) -> None:
    series = background()
    series["web"] = {"page served": Series(level="INFO", minutes=steady(100))}
    series["api"]["GET /orders done"] = Series(
        level="INFO", minutes={**steady(40), **{m: 2 for m in HOUR[45:48]}})
    usual = [6, 6, 7, 5, 6, 8, 6, 7]
    slowed = calls_into("db", usual, {i: [15] * 8 for i in range(45, 48)})
    # no line names db: the traces showed api's requests reaching db through a cache
    graph = {"api": {"cache": 60}, "cache": {"db": 60}}
    incidents = find_incidents(find_departures(series, hops=slowed, calls=graph))
    assert [(i.origin, i.callers) for i in incidents] == [("db", ["api"])]
    assert incidents[0].suffered("failed calling it") == "api, which call it, went quiet"
    # the cache between them goes quiet too: it was held, and so were its callers
    series["cache"] = {"hit": Series(level="INFO", minutes={
        **steady(50), **{m: 3 for m in HOUR[45:48]}})}
    incidents = find_incidents(find_departures(series, hops=slowed, calls=graph))
    assert [(i.origin, i.callers) for i in incidents] == [("db", ["api", "cache"])]
    del series["cache"]
    # a call the traces showed twice is not yet the call graph: api is its own incident
    seldom = {"api": {"cache": 60}, "cache": {"db": 2}}
    incidents = find_incidents(find_departures(series, hops=slowed, calls=seldom))
    assert sorted((i.origin, tuple(i.callers)) for i in incidents) == [
        ("api", ()), ("db", ())]


def test_a_callee_slowed_with_its_caller_is_the_callers_and_one_slowed_first_its_own(
) -> None:
    """A call is timed from its caller's line: a starved or delayed caller sends late, so
    the services it calls look slow in the same minutes. A callee that slowed before its
    caller (a caller that waited on it) is an incident of its own."""
    usual = [6, 6, 7, 5, 6, 8, 6, 7]
    slow = [15] * 8

    def incidents(api: dict[int, list[int]], db: dict[int, list[int]]
                  ) -> list[tuple[str, list[str], list[str]]]:
        hops = calls_into("api", usual, api) | calls_into("db", usual, db)
        found = find_departures(background(), hops=hops, calls={"api": {"db": 60}})
        return [(i.origin, i.services, i.callers) for i in find_incidents(found)]

    # db is not api's caller: it is no caller of the incident, but one of its services
    assert incidents({45: slow}, {45: slow}) == [("api", ["api", "db"], [])]
    assert incidents({44: slow}, {45: slow}) == [("api", ["api", "db"], [])]
    assert sorted(incidents({46: slow}, {45: slow})) == [
        ("api", ["api"], []), ("db", ["db"], [])]
    assert incidents({}, {45: slow}) == [("db", ["db"], [])]


def test_failures_that_share_trace_ids_are_one_incident_at_the_shared_dependency() -> None:
    series = background()
    series["web"] = {"page served": Series(level="INFO", minutes=steady(100))}
    late = {m: 6 for m in HOUR[40:43]}
    # api and web each fail in their own requests; db fails in both callers' requests,
    # and no line names anyone: only the trace ids link them
    series["api"]["upstream error"] = Series(level="ERROR", minutes=late, traces=["a1", "a2"])
    series["web"]["render failed"] = Series(level="ERROR", minutes=late, traces=["b1", "b2"])
    series["db"]["statement aborted"] = Series(level="ERROR", minutes=late,
                                               traces=["a1", "b1"])
    (incident,) = find_incidents(find_departures(series))
    assert (incident.origin, incident.callers) == ("db", ["api", "web"])
    # without a shared id the three are three incidents
    series["db"]["statement aborted"] = Series(level="ERROR", minutes=late, traces=["c1"])
    assert sorted(i.origin for i in find_incidents(find_departures(series))) == [
        "api", "db", "web"]


def test_a_line_absent_from_a_short_baseline_by_chance_is_not_new() -> None:
    """One baseline minute cannot tell a new line from one that missed that minute: its
    rate since must make the silence unlikely before it is called new."""
    web = {"page served": Series(level="INFO", minutes=steady(100))}
    rare = {m: 1 for m in HOUR[1:]}  # a minute of its own rate: the baseline misses it
    series = {"web": web, "api": {"retrying": Series(level="WARN", minutes=rare)}}
    assert not find_departures(series).departures
    # the same silence before a line ten times as frequent is unlikely: new
    series["api"]["retrying"] = Series(level="WARN", minutes={m: 10 for m in HOUR[1:]})
    assert {d.kind for d in find_departures(series).departures} == {"new"}


def test_an_origins_errors_outrank_another_services_warnings() -> None:
    series = background()
    series["web"] = {"page served": Series(level="INFO", minutes=steady(100))}
    late = {m: 6 for m in HOUR[40:43]}
    series["api"]["payment call failed"] = Series(level="ERROR", minutes=late)
    series["web"]["slow render"] = Series(level="WARN", minutes=late)
    incidents = find_incidents(find_departures(series))
    assert [i.origin for i in incidents] == ["api", "web"]
    assert incidents[0].weight > incidents[1].weight


def test_a_line_written_a_few_times_a_minute_thins_out_over_several_minutes() -> None:
    series = background()
    few = {m: 3 + (i * 5) % 3 for i, m in enumerate(HOUR)}  # 3 to 5 a minute
    series["db"]["lock taken"] = Series(level="INFO", minutes=few)
    series["db"]["lock released"] = Series(
        level="INFO", minutes={**few, **dict.fromkeys(HOUR[45:50], 0)})
    found = find_departures(series).departures
    thin = sorted(d.minute for d in found if d.kind == "thin")
    # no single minute of 3 to 5 can tell; a few of them together can, and after the
    # line is back no minute is called thin
    assert thin and HOUR[45] < thin[0] <= HOUR[47] and thin[-1] <= HOUR[49]


def test_a_line_of_one_to_three_a_minute_that_halves_departs_and_one_running_late_not(
        ) -> None:
    series = background()
    few = {m: 1 + i % 3 for i, m in enumerate(HOUR)}  # 1, 2, 3, 1, 2, 3 ... a minute
    series["db"]["lock taken"] = Series(level="INFO", minutes=few)

    def thin(released: dict[str, int]) -> list[str]:
        series["db"]["lock released"] = Series(level="INFO", minutes={**few, **released})
        return [d.minute for d in find_departures(series).departures if d.kind == "thin"]

    # 0 of 1, 1 of 2, 2 of 3: no minute alone holds enough to tell, nor is the last
    # one thin by itself, but the three together are half of the usual
    assert thin({HOUR[45]: 0, HOUR[46]: 1, HOUR[47]: 2}) == [HOUR[47]]
    # one release written a second late, in the next minute: below usual, then above
    assert thin({HOUR[46]: 1, HOUR[47]: 4}) == []


def test_a_log_that_begins_mid_failure_names_it_and_one_that_begins_healthy_does_not(
        ) -> None:
    short = HOUR[:3]  # three minutes: too short for anything to prove chronic
    series = {"api": {"GET /orders done": Series(level="INFO", minutes=steady(80, short)),
                      "payment call failed": Series(level="ERROR", minutes=steady(8, short))},
              "db": {"query ok": Series(level="INFO", minutes=steady(30, short)),
                     "connection reset": Series(level="ERROR", minutes=steady(2, short))}}
    found = find_departures(series)
    assert not found.departures  # nothing departs: there is no past to depart from
    assert [(d.service, d.template, d.observed) for d in found.standing] == [
        ("api", "payment call failed", 24)]  # db's two a minute: too few to tell
    standing = find_unjudged(found)
    assert [(i.origin, i.severity, i.unjudged) for i in standing] == [("api", "low", True)]
    assert standing[0].title == "api: already failing when the log begins"
    # the same error starting in the second minute, once the first held a baseline, is
    # new: a departure, no standing condition
    series["api"]["payment call failed"] = Series(level="ERROR", minutes=steady(8, short[1:]))
    found = find_departures(series)
    assert not found.standing
    assert {(d.template, d.kind) for d in found.departures} == {("payment call failed", "new")}


def test_a_log_that_begins_in_the_last_seconds_of_a_minute_is_judged_from_a_full_one(
        ) -> None:
    # the first minute holds a few seconds: too few records for a baseline, so the
    # second is judged by nothing either and an error there is standing, not new
    short = HOUR[:3]
    series = {"api": {"GET /orders done": Series(
                          level="INFO", minutes={**steady(80, short), short[0]: 6}),
                      "payment call failed": Series(level="ERROR", minutes=steady(8, short[1:]))},
              "db": {"query ok": Series(level="INFO", minutes={**steady(30, short), short[0]: 2})}}
    found = find_departures(series)
    assert not found.departures
    assert [(d.template, d.observed) for d in found.standing] == [("payment call failed", 16)]


def test_a_log_cut_seconds_into_a_failure_names_it_from_the_minute_after() -> None:
    # a busy stream's first few seconds hold the records of a baseline but one of the
    # failing line: the full minute after them tells it was failing all along
    short = HOUR[:3]
    done = Series(level="INFO", minutes={**steady(300, short), short[0]: 110})

    def standing(failed: dict[str, int]) -> list[tuple[str, int]]:
        series = {"api": {"GET /orders done": done,
                          "payment call failed": Series(level="ERROR", minutes=failed)}}
        found = find_departures(series)
        return [(d.template, d.observed) for d in found.standing]

    assert standing({short[0]: 1, short[1]: 8, short[2]: 8}) == [("payment call failed", 17)]
    # two a minute after it: too few to tell, as in the opening minutes themselves
    assert standing({short[0]: 1, short[1]: 2, short[2]: 2}) == []
    # first written after the opening: not standing (the new test judges it)
    assert standing({short[1]: 8, short[2]: 8}) == []


def test_a_standing_error_that_proves_chronic_is_background_not_standing() -> None:
    series = background()
    series["api"]["payment call failed"] = Series(level="ERROR", minutes=steady(6))
    found = find_departures(series)
    assert ("api", "payment call failed") in found.chronic
    assert not found.standing
    # present at the start, then gone for good: it was failing when the log began
    series["api"]["payment call failed"] = Series(level="ERROR", minutes=steady(6, HOUR[:4]))
    found = find_departures(series)
    assert [(d.template, d.until) for d in found.standing] == [
        ("payment call failed", HOUR[3])]
    assert find_unjudged(found)[0].ended == "2026-11-29T10:04:00Z"


def test_a_standing_error_naming_a_callee_is_the_callees() -> None:
    short = HOUR[:3]
    series = {"web": {"page served": Series(level="INFO", minutes=steady(50, short)),
                      "no instances available for cart": Series(
                          level="ERROR", minutes=steady(5, short), named={"cart": 15})},
              "cart": {"cart read": Series(level="INFO", minutes=steady(20, short))}}
    standing = find_unjudged(find_departures(series))
    assert [(i.origin, i.callers) for i in standing] == [("cart", ["web"])]


YESTERDAY = [f"2026-11-28T{h:02d}:{m:02d}" for h in (22, 23) for m in range(60)]
MIDNIGHT = [f"2026-11-29T00:{m:02d}" for m in range(5)]


def test_a_window_is_judged_against_the_last_hours_of_the_window_before() -> None:
    # a pair learned yesterday evening: today the second line of it writes half as often
    pair = {"lock taken": Series(level="INFO", minutes=steady(20, YESTERDAY)),
            "lock released": Series(level="INFO", minutes=steady(20, YESTERDAY)),
            "lookup failed": Series(level="ERROR", minutes=steady(4, YESTERDAY))}
    before = {"db": pair, "api": {"GET done": Series(level="INFO", minutes=steady(50, YESTERDAY))}}
    today = {"db": {"lock taken": Series(level="INFO", minutes=steady(20, MIDNIGHT)),
                    "lock released": Series(level="INFO", minutes=steady(6, MIDNIGHT)),
                    "lookup failed": Series(level="ERROR", minutes=steady(4, MIDNIGHT))},
             "api": {"GET done": Series(level="INFO", minutes=steady(50, MIDNIGHT))}}
    alone = find_departures(today)
    assert not alone.departures  # no past: the thinned ratio is learned as normal
    assert [d.template for d in alone.standing] == ["lookup failed"]  # and this is new to it
    found = Walk().findings(today, before=before)
    assert {(d.template, d.kind) for d in found.departures} == {("lock released", "thin")}
    assert min(d.minute for d in found.departures) == MIDNIGHT[0]
    assert found.minutes == MIDNIGHT  # yesterday's minutes are baseline, not judged here
    assert ("db", "lookup failed") in found.chronic and not found.standing
    # yesterday more than the baseline's hours before today is no baseline
    old = {s: {t: Series(level=x.level, minutes={m.replace("11-28T2", "11-28T1"): n
                                                  for m, n in x.minutes.items()})
               for t, x in lines.items()} for s, lines in before.items()}
    assert not Walk().findings(today, before=old).departures


def test_a_burst_over_a_baseline_of_minutes_needs_more_than_over_one_of_an_hour() -> None:
    # one warning in two baseline minutes, then 8: a Poisson tail that took the short
    # baseline's rate (0.5 a minute) as exact called this a burst; the baseline's one
    # record is a noisy count itself, and together the two counts are unremarkable
    short = HOUR[:3]
    series = {"api": {"GET /orders done": Series(level="INFO", minutes=steady(100, short)),
                      "retrying call": Series(level="WARN", minutes={short[0]: 1, short[2]: 8})}}
    assert kinds(series) == set()
    # a like rate learned over forty minutes (a quarter of them: not chronic) makes the
    # same 8 a burst
    long = {m: 1 for m in HOUR[:40:4]}
    series["api"] = {"GET /orders done": Series(level="INFO", minutes=steady(100, HOUR[:41])),
                     "retrying call": Series(level="WARN", minutes={**long, HOUR[40]: 8})}
    assert kinds(series) == {("api", "burst")}


def test_a_volume_drop_after_a_baseline_of_a_minute_is_not_quiet_but_after_an_hour_is(
        ) -> None:
    short = HOUR[:2]
    series = {"api": {"GET /orders done": Series(level="INFO", minutes=steady(100, short))},
              "db": {"query ok": Series(level="INFO", minutes={short[0]: 30, short[1]: 5})}}
    assert kinds(series) == set()
    series = {"api": {"GET /orders done": Series(level="INFO", minutes=steady(100, HOUR[:31]))},
              "db": {"query ok": Series(level="INFO", minutes={**steady(30, HOUR[:30]),
                                                               HOUR[30]: 5})}}
    assert kinds(series) == {("db", "quiet")}


def test_an_error_begun_soon_after_the_log_is_early_and_after_a_baseline_is_new() -> None:
    # the log begins in a minute's last seconds: 120 records of baseline, then the error
    # comes a few times a minute; silence over 120 records proves nothing at that rate,
    # so the new test never decides and the line is early
    short = HOUR[:4]
    routine = {**steady(400, short), short[0]: 120}
    failing = {short[1]: 3, short[2]: 2, short[3]: 3}
    series = {"api": {"GET /orders done": Series(level="INFO", minutes=routine),
                      "payment call failed": Series(level="ERROR", minutes=failing)}}
    found = find_departures(series)
    assert not found.departures and not found.standing
    assert [(d.template, d.kind, d.minute, d.observed, d.until) for d in found.early] == [
        ("payment call failed", "early", short[1], 8, short[3])]
    early = find_unjudged(found)
    assert [(i.origin, i.severity, i.unjudged) for i in early] == [("api", "low", True)]
    assert early[0].title == "api: a new error early in the log"
    # a warning is no failure to name without a test; the same error after an hour is new
    series["api"]["payment call failed"] = Series(level="WARN", minutes=failing)
    assert not find_departures(series).early
    later = {m.replace("10:0", "10:4"): n for m, n in failing.items()}
    series = {"api": {"GET /orders done": Series(level="INFO", minutes=steady(400, HOUR[:44])),
                      "payment call failed": Series(level="ERROR", minutes=later)}}
    found = find_departures(series)
    assert not found.early
    assert {(d.template, d.kind) for d in found.departures} == {("payment call failed", "new")}


def test_the_binomial_tails_match_the_direct_sums_and_their_ends() -> None:
    def direct(ks: range, n: int, q: float) -> float:
        return math.fsum(math.comb(n, i) * q ** i * (1 - q) ** (n - i) for i in ks)

    for k, n, q in [(5, 20, 0.1), (30, 40, 0.3), (3, 500, 0.001), (9, 9, 1 / 3)]:
        assert _binomial_upper(k, n, q) == pytest.approx(direct(range(k, n + 1), n, q), rel=1e-9)
    for k, n, q in [(1, 20, 0.5), (3, 40, 0.6), (100, 600, 0.3), (0, 9, 0.2)]:
        assert _binomial_lower(k, n, q) == pytest.approx(direct(range(k + 1), n, q), rel=1e-9)
    # a minute with no routine records (q = 0) or a baseline with none (q = 1)
    assert (_binomial_upper(3, 3, 0.0), _binomial_upper(0, 3, 0.0)) == (0.0, 1.0)
    assert (_binomial_lower(2, 3, 1.0), _binomial_lower(3, 3, 1.0)) == (0.0, 1.0)


def after_lookup(found: dict[str, int], then: str = "route found", requests: int = 24
                 ) -> NextLinesTable:
    """``Report.next_lines`` of db: per minute, ``requests`` lookups, ``found[m]`` of them
    followed by ``then`` in their request, the rest by nothing."""
    return {"db": {"route lookup": {
        then: {m: k for m, k in found.items() if k},
        "": {m: requests - k for m, k in found.items() if requests - k}}}}


def test_a_line_that_stops_following_its_lead_in_requests_departs_on_a_minute_of_past(
        ) -> None:
    # three minutes: one to learn from, too few for a partner moving with it minute by
    # minute; in requests "route found" came right after every lookup, then after 5 of 24
    short = HOUR[:3]
    counts = {short[0]: 24, short[1]: 5, short[2]: 4}
    series = {"api": {"GET /orders done": Series(level="INFO", minutes=steady(80, short))},
              "db": {"route lookup": Series(level="INFO", minutes=steady(24, short)),
                     "route found": Series(level="INFO", minutes=counts)}}
    found = find_departures(series, next_lines=after_lookup(counts))
    assert [(d.service, d.template, d.kind, d.minute, d.observed, d.expected)
            for d in found.departures] == [("db", "route found", "thin", short[1], 5, 24.0),
                                           ("db", "route found", "thin", short[2], 4, 24.0)]
    # the same counts from requests where it never came right after the lookup: no
    # request showed the two together, and a minute's counts alone prove nothing
    apart = {"db": {"route lookup": {"": steady(24, short)},
                    "route found": {"": counts}}}
    assert find_departures(series, next_lines=apart).departures == []
    assert find_departures(series).departures == []
    # marks name lines by their templates' heads: a long line is found by its head, and
    # so is one mined before its variable became <*>
    long = "route found for " + "<*> " * 30
    series["db"] = {"route lookup": series["db"]["route lookup"],
                    long.strip(): Series(level="INFO", minutes=counts)}
    nexts = after_lookup(counts, template_head("route found for 42 " + "<*> " * 30))
    assert [(d.template, d.minute) for d in find_departures(series, next_lines=nexts).departures
            ] == [(long.strip(), short[1]), (long.strip(), short[2])]
    series["db"] = {"route lookup": series["db"]["route lookup"],
                    "route found": Series(level="INFO", minutes=counts)}
    # after 20 of 24: a wobble, not an early return
    wobble = {short[0]: 24, short[1]: 20, short[2]: 22}
    series["db"]["route found"] = Series(level="INFO", minutes=wobble)
    assert find_departures(series, next_lines=after_lookup(wobble)).departures == []


def test_a_line_that_followed_its_lead_in_half_the_requests_departs_only_when_gone(
        ) -> None:
    # a cache miss path: "route loaded" after half the lookups all hour; a quarter in
    # one minute is chance, none in three minutes running is not
    half = {m: 12 for m in HOUR}
    quarter = {**half, HOUR[40]: 6}
    series = background()
    series["db"]["route lookup"] = Series(level="INFO", minutes=steady(24))
    series["db"]["route loaded"] = Series(level="INFO", minutes=quarter)

    def found(loaded: dict[str, int]) -> list[tuple[str, str]]:
        nexts = after_lookup(loaded, "route loaded")
        return [(d.template, d.minute) for d in find_departures(
            series, next_lines=nexts).departures if d.kind == "thin"]

    assert found(quarter) == []
    gone = {**half, HOUR[40]: 0, HOUR[41]: 0, HOUR[42]: 0}
    series["db"]["route loaded"] = Series(level="INFO", minutes=gone)
    assert found(gone)[:1] == [("route loaded", HOUR[40])]


def lookups(then_by_minute: dict[str, str], minutes: list[str], requests: int = 24
            ) -> tuple[dict[str, dict[str, Series]], NextLinesTable]:
    """db's series and ``Report.next_lines`` when every lookup of a minute is followed by
    the line ``then_by_minute`` names for it (levels by the line's last word)."""
    lines: dict[str, dict[str, int]] = {"route lookup": steady(requests, minutes)}
    nexts: dict[str, dict[str, int]] = {}
    for minute, then in then_by_minute.items():
        lines.setdefault(then, {})[minute] = requests
        nexts.setdefault(then, {})[minute] = requests
    series = {"api": {"GET /orders done": Series(level="INFO", minutes=steady(80, minutes))},
              "db": {t: Series(level="ERROR" if t.endswith("failed") else "INFO", minutes=m)
                     for t, m in lines.items()}}
    return series, {"db": {"route lookup": nexts}}


def test_a_failure_that_stops_following_its_lead_is_a_recovery_not_a_thinning() -> None:
    minutes = HOUR[:4]
    series, nexts = lookups({minutes[0]: "route lookup failed", minutes[1]: "route found",
                             minutes[2]: "route found", minutes[3]: "route found"}, minutes)
    assert [d for d in find_departures(series, next_lines=nexts).departures
            if d.kind == "thin"] == []
    # the same requests with a routine line in its place: that one thinned
    series, nexts = lookups({minutes[0]: "route cached", minutes[1]: "route found",
                             minutes[2]: "route found", minutes[3]: "route found"}, minutes)
    assert [(d.template, d.minute) for d in find_departures(series, next_lines=nexts).departures
            if d.kind == "thin"] == [("route cached", minutes[1]), ("route cached", minutes[2]),
                                     ("route cached", minutes[3])]


def test_what_followed_a_lead_while_its_usual_line_was_gone_is_not_learned_as_usual(
        ) -> None:
    # found after every lookup, then a retry instead for three minutes, then found again:
    # the retry's end is the failure ending, not a line thinning out
    minutes = HOUR[:6]
    plan = {minutes[0]: "route found", **dict.fromkeys(minutes[1:4], "retry scheduled"),
            minutes[4]: "route found", minutes[5]: "route found"}
    series, nexts = lookups(plan, minutes)
    assert [(d.template, d.minute) for d in find_departures(series, next_lines=nexts).departures
            if d.kind == "thin"] == [("route found", m) for m in minutes[1:4]]


def test_an_origin_without_a_failing_line_began_at_its_own_thinning_not_its_callers(
        ) -> None:
    # api times out calling db from 10:40; db logs no failure, but from 10:41 its
    # lookups are no longer followed by what usually follows them
    series = background()
    found = {**steady(24), **dict.fromkeys(HOUR[41:44], 4)}
    series["db"]["route lookup"] = Series(level="INFO", minutes=steady(24))
    series["db"]["route found"] = Series(level="INFO", minutes=found)
    series["api"]["Read timed out calling db"] = Series(
        level="ERROR", minutes=dict.fromkeys(HOUR[40:44], 8), named={"db": 32})
    (incident,) = find_incidents(find_departures(series, next_lines=after_lookup(found)))
    assert (incident.origin, incident.callers) == ("db", ["api"])
    assert incident.started == "2026-11-29T10:41:00Z"


def test_a_callers_thinning_weighs_half_of_what_its_failing_line_does() -> None:
    # db fails and thins; api, which calls it, thins with it or fails calling it
    db = [Departure(HOUR[40], "db", "pool exhausted", "new", 6, 0.0, 8.0, True, error=True),
          Departure(HOUR[40], "db", "query ok", "thin", 3, 30.0, 8.0, False)]
    thinned = Departure(HOUR[40], "api", "order saved", "thin", 2, 20.0, 8.0, False)
    failed = Departure(HOUR[40], "api", "Read timed out calling db", "new", 8, 0.0, 8.0, True,
                       named=("db",), error=True)
    for caller, weight in ((thinned, 8 + 4 + 2), (failed, 8 + 4 + 4)):
        (incident,) = find_incidents(Findings(departures=[*db, caller],
                                              calls={"api": {"db"}}))
        assert (incident.origin, incident.callers, incident.weight) == ("db", ["api"], weight)
