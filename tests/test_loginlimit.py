"""Each source's logins are checked a few at a time (``loginlimit``), and a source is the sender the
hub can trust: a learner's server by the address it connects from, a browser by what the proxy saw.
The hub test: tests/test_workshop_attacks.py::test_21."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from multigpu.workshop import loginlimit, namespaces


def handler(peer: str, remote_ip: str) -> SimpleNamespace:
    sock = SimpleNamespace(getpeername=lambda: (peer, 40000))
    return SimpleNamespace(request=SimpleNamespace(connection=SimpleNamespace(stream=SimpleNamespace(socket=sock)),
                                                   remote_ip=remote_ip))


def test_a_learners_server_is_known_by_its_own_address_and_a_browser_by_what_the_proxy_saw():
    learner = namespaces.loopback_of(1007)
    assert learner.startswith("127.") and learner != "127.0.0.1"
    assert len({namespaces.loopback_of(uid) for uid in range(1000, 1300)}) == 300
    assert loginlimit.source_of(handler(learner, "10.9.1.2")) == learner, "X-Forwarded-For claimed a sender"
    assert loginlimit.source_of(handler("127.0.0.1", "192.168.4.20")) == "192.168.4.20"
    assert loginlimit.source_of(SimpleNamespace(request=SimpleNamespace(connection=None, remote_ip="1.2.3.4"))) == "1.2.3.4"


def test_one_sources_flood_runs_two_checks_at_a_time_and_is_refused_past_its_places_while_another_goes_on():
    async def scenario() -> tuple[int, list[object], float]:
        gates = loginlimit.Gates()
        running = peak = 0

        async def check() -> str:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.2)
            running -= 1
            return "learner"

        flood = [asyncio.ensure_future(gates.run("attacker", check)) for _ in range(100)]
        await asyncio.sleep(0.05)
        began = time.monotonic()
        assert await gates.run("other", check) == "learner"
        other_s = time.monotonic() - began
        answers = await asyncio.gather(*flood)
        assert gates.gates == {}, "a source with nothing running or waiting is forgotten"
        return peak, answers, other_s

    peak, answers, other_s = asyncio.run(scenario())
    assert peak == loginlimit.PER_SOURCE + 1  # the attacker's two and the other's one
    held = loginlimit.PER_SOURCE + loginlimit.WAITING_PER_SOURCE
    assert answers.count("learner") == held and answers.count(None) == 100 - held
    assert other_s < 0.35, f"another source waited {other_s:.2f} s behind the flood"
