"""The asyncio client: the same semantics over grpc.aio."""
from __future__ import annotations

import asyncio
import uuid

import pytest

import egress_proxies as ep
from conftest import metric
from egress_proxies.aio import AsyncClient


def run(coro):
    return asyncio.run(coro)


def test_async_lease_reports_and_releases(env):
    async def main():
        async with AsyncClient("grpcs://" + env["grpcTLS"], token=env["token"], ca_file=env["caFile"]) as c:
            t = f"a-{uuid.uuid4().hex[:12]}.test"
            async with c.lease(env["selector"], target=t) as lease:
                assert lease.credentials
                held = sum(p.lease_count for p in await c.list_proxies(env["selector"]))
            with pytest.raises(RuntimeError):
                async with c.lease(env["selector"], target=t) as failing:
                    failing.set_outcome(ep.BLOCKED, 403)
                    raise RuntimeError("a block page")
            cooling = [p.id for p in await c.list_proxies(env["selector"], target=t) if p.cooldown_until]
            left = sum(p.lease_count for p in await c.list_proxies(env["selector"]))
            return lease, held, failing, cooling, left

    blocked = metric(env, "proxy_operator_broker_reports_total", result="blocked")
    lease, held, failing, cooling, left = run(main())
    assert held == 1 and left == 0
    assert cooling == [failing.proxy.id], "the outcome set in the block was reported, not error"
    assert metric(env, "proxy_operator_broker_reports_total", result="blocked") == blocked + 1


def test_async_typed_refusal_and_await_form(env):
    async def main():
        async with AsyncClient("grpc://" + env["grpcPlain"], token=env["token"]) as c:
            lease = await c.lease(env["selector"])
            await lease.release()
            with pytest.raises(ep.LeaseGone):
                await lease.report(ep.OK)
            with pytest.raises(ep.NoProxyAvailable) as refused:
                await c.lease({"pool": "no-such-pool"})
            return refused.value

    assert run(main()).reason == "NO_MATCHING_PROXY"


def test_async_list_proxies_walks_every_page(env):
    async def main():
        async with AsyncClient("grpcs://" + env["grpcTLS"], token=env["token"], ca_file=env["caFile"]) as c:
            whole = [p.id for p in await c.list_proxies(env["selector"])]
            assert len(whole) >= 2
            assert [p.id for p in await c.list_proxies(env["selector"], page_size=1)] == whole
    run(main())


def test_async_watch_proxies_sends_the_set_then_synced(env):
    async def main():
        async with AsyncClient("grpcs://" + env["grpcTLS"], token=env["token"], ca_file=env["caFile"]) as c:
            listed = [p.id for p in await c.list_proxies(env["selector"])]
            events = c.watch_proxies(env["selector"])
            first = []
            async for e in events:
                if e.kind == ep.SYNCED:
                    break
                first.append(e.proxy.id)
            await events.aclose()
            assert first == listed
    run(main())


def test_a_cancelled_task_reports_nothing_and_leaves_no_lease(env):
    before = {r: metric(env, "proxy_operator_broker_reports_total", result=r) for r in ep.RESULTS}

    async def main():
        async with AsyncClient("grpc://" + env["grpcPlain"], token=env["token"]) as c:
            entered = asyncio.Event()

            async def crawl():
                async with c.lease(env["selector"], target=f"c-{uuid.uuid4().hex[:12]}.test"):
                    entered.set()
                    await asyncio.sleep(60)

            task = asyncio.ensure_future(crawl())
            await entered.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return sum(p.lease_count for p in await c.list_proxies(env["selector"]))

    assert run(main()) == 0
    after = {r: metric(env, "proxy_operator_broker_reports_total", result=r) for r in ep.RESULTS}
    assert after == before, "a cancellation is no verdict on the proxy"


def test_lease_requests_cancelled_in_flight_leave_no_lease(env):
    """CreateLease calls cancelled at every point of their flight: those the
    broker granted are found by their request id and released."""
    async def main():
        async with AsyncClient("grpc://" + env["grpcPlain"], token=env["token"]) as c:
            for delay in (0, 0.001, 0.002, 0.005, 0.01, 0.02):
                tasks = [asyncio.ensure_future(c.lease(env["selector"], ttl=60)) for _ in range(5)]
                await asyncio.sleep(delay)
                for t in tasks:
                    t.cancel()
                for t in tasks:
                    try:
                        lease = await t
                        await lease.release()  # it finished before the cancel
                    except asyncio.CancelledError:
                        pass
        # close() awaited the clean-ups
        async with AsyncClient("grpc://" + env["grpcPlain"], token=env["token"]) as c:
            return sum(p.lease_count for p in await c.list_proxies(env["selector"]))

    assert run(main()) == 0


def test_async_callers_exception_reports_nothing(env):
    before = {r: metric(env, "proxy_operator_broker_reports_total", result=r) for r in ep.RESULTS}

    async def main():
        async with AsyncClient("grpc://" + env["grpcPlain"], token=env["token"]) as c:
            bug = ValueError("the caller's own bug")
            with pytest.raises(ValueError) as raised:
                async with c.lease(env["selector"], target=f"v-{uuid.uuid4().hex[:12]}.test"):
                    raise bug
            assert raised.value is bug
            return sum(p.lease_count for p in await c.list_proxies(env["selector"]))

    assert run(main()) == 0
    assert {r: metric(env, "proxy_operator_broker_reports_total", result=r) for r in ep.RESULTS} == before
