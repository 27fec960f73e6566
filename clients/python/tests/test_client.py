"""The blocking client against a real broker (TLS, bearer token), Redis and
Squid."""
from __future__ import annotations

import socket
import ssl
import threading
import time
import urllib.request
import uuid

import pytest

import egress_proxies as ep
from conftest import metric


@pytest.fixture
def client(env):
    with ep.Client("grpcs://" + env["grpcTLS"], token=env["token"], ca_file=env["caFile"]) as c:
        yield c


def target() -> str:
    # Each test its own target, so cooldowns of one never steer another.
    return f"t-{uuid.uuid4().hex[:12]}.test"


def fetch_ip(env, lease) -> str:
    """The HTTPS echo's answer through the leased proxy: a CONNECT tunnel
    with the lease's credentials."""
    ctx = ssl.create_default_context(cafile=env["httpsEchoCA"])
    opener = urllib.request.build_opener(urllib.request.ProxyHandler(lease.proxies), urllib.request.HTTPSHandler(context=ctx))
    return opener.open(env["httpsEcho"] + "/ip", timeout=10).read().decode().strip()


def live_leases(client, env) -> int:
    return sum(p.lease_count for p in client.list_proxies(env["selector"]))


def test_a_lease_egresses_through_its_proxy_reports_ok_and_releases(client, env):
    oks = metric(env, "proxy_operator_broker_reports_total", result="ok")
    with client.lease(env["selector"], target=target(), ttl=30) as lease:
        assert lease.credentials, "a broker with a token hands out the proxy's credentials"
        assert fetch_ip(env, lease) == lease.proxy.egress_ip
        assert live_leases(client, env) == 1
    assert live_leases(client, env) == 0, "the with block released it"
    assert metric(env, "proxy_operator_broker_reports_total", result="ok") == oks + 1, "and reported ok"


def reports(env) -> dict:
    return {r: metric(env, "proxy_operator_broker_reports_total", result=r) for r in ep.RESULTS}


def test_the_callers_own_exception_is_reraised_unchanged_and_reports_nothing(client, env):
    before = reports(env)
    bug = ValueError("the caller's own bug")
    with pytest.raises(ValueError) as raised:
        with client.lease(env["selector"], target=target()):
            raise bug
    assert raised.value is bug, "re-raised unchanged"
    assert live_leases(client, env) == 0, "and still released"
    assert reports(env) == before, "no verdict on the proxy"


@pytest.mark.parametrize("exc,result", [
    (ConnectionRefusedError(111, "the proxy refused the connection"), ep.ERROR),
    (ConnectionResetError(104, "the site hung up"), ep.TARGET_ERROR),
    (ssl.SSLError(1, "the site's TLS failed"), ep.TARGET_ERROR),
])
def test_a_transport_failure_is_reported_against_whoever_failed(client, env, exc, result):
    before = reports(env)
    with pytest.raises(type(exc)):
        with client.lease(env["selector"], target=target()):
            raise exc
    assert live_leases(client, env) == 0
    after = reports(env)
    assert {r: after[r] - before[r] for r in ep.RESULTS if after[r] != before[r]} == {result: 1}


def test_an_interrupt_reports_nothing_and_releases(client, env):
    before = reports(env)
    with pytest.raises(KeyboardInterrupt):
        with client.lease(env["selector"], target=target()):
            raise KeyboardInterrupt
    assert live_leases(client, env) == 0
    assert reports(env) == before


def test_reports_refused_at_the_tokens_rate_are_never_raised(env):
    """Broker 2 takes 10 reports a second from the token: 500 clean blocks
    in a row have most of their ok refused. None raises; each is counted;
    every lease is released."""
    with ep.Client("grpc://" + env["grpcReportLimited"], token=env["token"]) as c:
        for _ in range(500):
            with c.lease(env["selector"], target=target()):
                pass
        assert c.exit_failures["report"] > 0, "the token's report rate refused some"
        assert c.exit_failures["release"] == 0
        assert live_leases(c, env) == 0


def test_a_report_failing_at_exit_never_replaces_the_callers_exception(env):
    with ep.Client("grpc://" + env["grpcReportLimited"], token=env["token"]) as c:
        raised = []
        for _ in range(30):  # past the burst of 10
            try:
                with c.lease(env["selector"], target=target()):
                    raise ConnectionResetError(104, "the site hung up")
            except BaseException as exc:  # noqa: BLE001
                raised.append(exc)
        assert all(isinstance(e, ConnectionResetError) for e in raised), {type(e).__name__ for e in raised}
        assert c.exit_failures["report"] > 0
        assert live_leases(c, env) == 0


def test_an_outcome_set_in_the_block_is_reported_and_cools_the_proxy(client, env):
    t = target()
    with client.lease(env["selector"], target=t) as lease:
        lease.set_outcome(ep.RATE_LIMITED, 429)
    cooling = {p.id: p.cooldown_until for p in client.list_proxies(env["selector"], target=t)}
    assert cooling[lease.proxy.id] is not None, "the report cooled the proxy down for the target"
    assert [i for i, c in cooling.items() if c] == [lease.proxy.id], "and only it"
    with client.lease(env["selector"], target=t) as other:
        assert other.proxy.id != lease.proxy.id, "the next lease for the target goes elsewhere"


def test_an_explicit_report_is_not_doubled_at_exit(client, env):
    before = metric(env, "proxy_operator_broker_reports_total")
    with client.lease(env["selector"], target=target()) as lease:
        r = lease.report(ep.OK, status_code=200, latency=0.05)
        assert r.actions == ("NONE",), "ok on a proxy that never cooled down for a fresh target changes nothing"
    assert metric(env, "proxy_operator_broker_reports_total") == before + 1


def test_the_lease_is_renewed_while_held(client, env):
    with client.lease(env["selector"], target=target(), ttl=10) as lease:
        first = lease.expires_at
        time.sleep(13)  # past the TTL: only renewals keep it
        assert lease.expires_at > first
        assert lease.lost is None
        lease.report(ep.OK)  # the broker still knows it
    assert live_leases(client, env) == 0


def test_typed_refusals(client, env):
    with pytest.raises(ep.NoProxyAvailable) as refused:
        client.lease({"pool": "no-such-pool"})
    assert refused.value.reason == "NO_MATCHING_PROXY"
    assert refused.value.retry_after == 10
    assert not isinstance(refused.value, ep.TargetPaced)
    with pytest.raises(ep.InvalidRequest, match="ttl"):
        client.lease(env["selector"], ttl=999999)
    with pytest.raises(ep.Unauthenticated):
        with ep.Client("grpcs://" + env["grpcTLS"], token="not-the-token", ca_file=env["caFile"]) as bad:
            bad.lease(env["selector"])
    with pytest.raises(ValueError, match="grpc://"):
        ep.Client("https://" + env["grpcTLS"])


def test_a_released_lease_is_gone(client, env):
    lease = client.lease(env["selector"], target=target())
    lease.release()
    lease.release()  # harmless twice
    with pytest.raises(ep.LeaseGone) as gone:
        lease.renew()
    assert gone.value.lease_id == lease.id


def test_a_request_id_names_one_lease(client, env):
    rid = uuid.uuid4().hex
    a = client.lease(env["selector"], request_id=rid)
    b = client.lease(env["selector"], request_id=rid)
    try:
        assert a.id == b.id, "the same request id is the same lease, not a second proxy"
        assert live_leases(client, env) == 1
    finally:
        a.release()


def test_plaintext_broker_and_sessions(env):
    with ep.Client("grpc://" + env["grpcPlain"], token=env["token"]) as plain:
        with plain.lease(env["selector"], session_key="login-1") as first:
            with plain.lease(env["selector"], session_key="login-1") as again:
                assert again.proxy.id == first.proxy.id, "a session keeps its proxy"


def test_unavailable_is_retried(env):
    """A broker that is not there yet (restarting) answers UNAVAILABLE; the
    client tries again with the same request id and gets its lease."""
    host, port = env["grpcPlain"].rsplit(":", 1)
    front = socket.socket()
    front.bind(("127.0.0.1", 0))
    addr = front.getsockname()
    front.close()  # nothing listens there for now

    def serve_later():
        time.sleep(0.5)
        srv = socket.create_server(addr)
        srv.settimeout(10)
        try:
            while True:
                c, _ = srv.accept()
                b = socket.create_connection((host, int(port)))
                for a, z in ((c, b), (b, c)):
                    threading.Thread(target=pipe, args=(a, z), daemon=True).start()
        except OSError:
            pass
        finally:
            srv.close()

    threading.Thread(target=serve_later, daemon=True).start()
    with ep.Client(f"grpc://{addr[0]}:{addr[1]}", token=env["token"]) as late:
        with late.lease(env["selector"], target=target()) as lease:
            assert lease.id


def pipe(a, z):
    try:
        while data := a.recv(65536):
            z.sendall(data)
    except OSError:
        pass
    finally:
        z.close()


def test_list_proxies_walks_every_page(client, env):
    whole = [p.id for p in client.list_proxies(env["selector"])]
    assert len(whole) >= 2, "the environment's fleet spans pages of one"
    assert whole == sorted(whole)
    assert [p.id for p in client.list_proxies(env["selector"], page_size=1)] == whole


def wait_metric(env, name: str, want: float) -> float:
    deadline = time.monotonic() + 10
    while (got := metric(env, name)) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def test_watch_proxies_sends_the_set_then_synced_and_ends_when_closed(client, env):
    listed = [p.id for p in client.list_proxies(env["selector"])]
    events = client.watch_proxies(env["selector"])
    first = []
    for e in events:
        if e.kind == ep.SYNCED:
            assert e.proxy is None
            break
        assert e.kind == ep.UPSERT
        first.append(e.proxy.id)
    assert first == listed, "the first set is what list_proxies lists, in id order"
    assert wait_metric(env, "proxy_operator_broker_watches", 1) == 1
    events.close()
    assert wait_metric(env, "proxy_operator_broker_watches", 0) == 0, "closing the iterator ends the watch on the broker"
