"""The traffic proxy in front of the real llama-server: transparent, measuring what the engine counted, a
replayable trace of an agent's conversation, a dropped stream that frees its slot, keys kept out of every
file, and the traffic on the dashboard and in its recording."""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest

from tests.screen import screen_text
from tests.test_dashboard import make_app, wait_for
from tests.test_fleet_real_engines import start_keyed_llama
from tests.waiting import until, until_async
from tui.base.process import free_port, stop_group
from tui.model.targets import EngineTarget
from tui.net.listen import Listen
from tui.proxy.options import ProxyOptions, build_proxy
from tui.proxy.source import RemoteTraffic
from tui.proxy.stream import event_json
from tui.record.reader import Recording
from tui.record.report import render_recording
from tui.record.schema import SUFFIX
from tui.record.writer import Recorder
from tui.ui.replay import ReplayApp

pytestmark = pytest.mark.engine  # every test here talks to a real llama-server

TRACE_KEYS = {"timestamp", "input_length", "output_length", "hash_ids", "session_id", "delay"}


def proxy_options(name: str, tmp_path: Path, **kwargs) -> ProxyOptions:
    return ProxyOptions({name: Listen("127.0.0.1", free_port())}, key_file=tmp_path / "trace-key", **kwargs)


async def stream_events(client: httpx.AsyncClient, url: str, body: dict) -> list[bytes]:
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as reply:
        assert reply.status_code == 200, await reply.aread()
        raw = b"".join([part async for part in reply.aiter_bytes()])
    return [e for e in raw.split(b"\n\n") if e]


def normalised(events: list[bytes]) -> list[object]:
    """What must be equal between two runs at temperature 0: everything but ids, times and cache counts."""
    out: list[object] = []
    for event in events:
        obj = event_json(event + b"\n\n")
        if obj is None:
            out.append(event)
            continue
        obj = {k: v for k, v in obj.items() if k not in ("id", "created")}
        for timed in ("timings", "metrics"):  # llama.cpp's and vLLM's own timings of the request
            if timed in obj:
                obj[timed] = sorted(obj[timed])
        if "usage" in obj:
            obj["usage"] = {k: v for k, v in obj["usage"].items() if k != "prompt_tokens_details"}
        out.append(obj)
    return out


def text_of(events: list[bytes]) -> str:
    parts = []
    for event in events:
        obj = event_json(event + b"\n\n") or {}
        for choice in obj.get("choices") or ():
            parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


async def test_the_client_gets_the_events_it_would_get_direct_with_and_without_usage(llama_server, tmp_path):
    proxy = build_proxy(proxy_options("llama", tmp_path), [EngineTarget("llama", llama_server.url)])
    await proxy.start()
    via = proxy.routes[0].proxy_url
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            for usage in (False, True):
                body = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 24,
                        "temperature": 0, "stream": True, "ignore_eos": True}
                if usage:
                    body["stream_options"] = {"include_usage": True}
                direct = await stream_events(client, llama_server.url, body)
                proxied = await stream_events(client, via, body)
                assert normalised(proxied) == normalised(direct)
                assert text_of(proxied) == text_of(direct) and text_of(direct)
                last = event_json(proxied[-2] + b"\n\n")
                assert ("usage" in last) is usage and "timings" in last  # as llama-server sends them
                record = proxy.books["llama"].recent()[-1]
                assert record.outcome == "ok" and record.completion_tokens == 24 and record.token_events >= 20
                if usage:  # what the proxy counted is what the engine told the client
                    assert record.prompt_tokens == last["usage"]["prompt_tokens"]
                    assert record.cached_tokens == last["usage"]["prompt_tokens_details"]["cached_tokens"]
                    assert record.cached_tokens == last["timings"]["cache_n"] > 0  # the direct run cached it
                assert record.ttft_s is not None and record.ttft_s < record.e2e_s
                assert record.itl_p50_s is not None and record.itl_max_s >= record.itl_p50_s
            # the engine's own errors pass through with their status and body
            errors = (("GET", "/no-such-path", None), ("POST", "/v1/chat/completions", b"{"))
            for method, path, content in errors:
                direct_reply = await client.request(method, llama_server.url + path, content=content)
                via_reply = await client.request(method, via + path, content=content)
                assert via_reply.status_code == direct_reply.status_code >= 400
                assert via_reply.content == direct_reply.content
    finally:
        await proxy.stop()


async def test_an_agent_conversation_is_one_session_whose_trace_replays(llama_server, tmp_path):
    trace = tmp_path / "agent.jsonl"
    options = proxy_options("llama", tmp_path, trace=trace, block_size=16)
    proxy = build_proxy(options, [EngineTarget("llama", llama_server.url)])
    await proxy.start()
    via = proxy.routes[0].proxy_url
    messages = [{"role": "system", "content": "You are a terse assistant. " * 6},
                {"role": "user", "content": "List two fruits."}]
    engine_cached = []
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            for turn in range(3):
                if turn:
                    await asyncio.sleep(0.3)  # the agent thinks
                body = {"messages": messages, "max_tokens": 12, "temperature": 0, "stream": turn != 1}
                if turn == 2:
                    body["stream_options"] = {"include_usage": True}
                if body["stream"]:
                    events = await stream_events(client, via, body)
                    reply = text_of(events)
                    usage = event_json(events[-2] + b"\n\n").get("usage")
                else:
                    answer = (await client.post(via + "/v1/chat/completions", json=body)).json()
                    reply, usage = answer["choices"][0]["message"]["content"], answer["usage"]
                if usage:
                    engine_cached.append(usage["prompt_tokens_details"]["cached_tokens"])
                messages = [*messages, {"role": "assistant", "content": reply},
                            {"role": "user", "content": f"And {turn + 2} more?"}]
    finally:
        await proxy.stop()  # writes what is queued
    records = proxy.books["llama"].recent()
    assert [r.cached_tokens for r in records if not (r.stream and r is records[0])][-len(engine_cached):] == \
        engine_cached
    lines = [orjson.loads(line) for line in trace.read_text().splitlines()]
    assert len(lines) == 3 and all(set(line) <= TRACE_KEYS for line in lines)
    assert len({line["session_id"] for line in lines}) == 1
    inputs = [line["input_length"] for line in lines]
    assert inputs == sorted(inputs) and len(set(inputs)) == 3
    assert [line["input_length"] for line in lines] == [r.prompt_tokens for r in records]
    assert [line["output_length"] for line in lines] == [12, 12, 12]
    for line in lines:
        assert len(line["hash_ids"]) == math.ceil(line["input_length"] / 16)
    for before, after in itertools.pairwise(lines):
        full = before["input_length"] // 16  # the full blocks of a turn are the next turn's first blocks
        assert after["hash_ids"][:full - 1] == before["hash_ids"][:full - 1] and full > 2
    assert "delay" not in lines[0] and all(line["delay"] >= 300 for line in lines[1:])
    assert [line["timestamp"] for line in lines] == sorted(line["timestamp"] for line in lines)
    meta = orjson.loads(trace.with_name(trace.name + ".meta.json").read_bytes())
    assert meta["block_size"] == 16 and meta["engines"] == {"llama": llama_server.url}
    assert "tokenize" in meta["tokenizer"] and len(meta["key_id"]) == 16
    assert proxy.trace.failures == []


async def metric(client: httpx.AsyncClient, url: str, name: str) -> float:
    for line in (await client.get(url + "/metrics")).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in {url}/metrics")


async def test_a_stream_dropped_after_a_few_tokens_frees_the_engines_slot_within_1s(llama_server, tmp_path):
    proxy = build_proxy(proxy_options("llama", tmp_path), [EngineTarget("llama", llama_server.url)])
    await proxy.start()
    body = {"messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 2000,
            "ignore_eos": True, "stream": True}
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            async with client.stream("POST", proxy.routes[0].proxy_url + "/v1/chat/completions",
                                     json=body) as reply:
                seen = 0
                # The lines' iterator is held until the stream is dropped: an async generator left by `break`
                # with nothing holding it is closed by asyncio's finalizer on the next turns of the loop, and
                # httpcore closes the connection with it, so the client left at once (a race that, once lost,
                # read requests_processing 0 for the whole wait below).
                lines = reply.aiter_lines()
                async for line in lines:
                    seen += '"content":"' in line
                    if seen >= 3:
                        break
                assert seen >= 3, f"the engine ended the stream after {seen} tokens of 2000"
                # Read until it shows rather than once: the engine counts the slot at its next metrics task.
                async def busy() -> bool:
                    return await metric(client, llama_server.url, "llamacpp:requests_processing") == 1

                await until_async(busy, "requests_processing 1 mid-stream", timeout=5, every=0.1)
            dropped = time.monotonic()
            await until_async(lambda: proxy.books["llama"].total, "the proxy to count the abandon")
            while await metric(client, llama_server.url, "llamacpp:requests_processing") != 0:
                assert time.monotonic() - dropped < 1.0, "the engine still generates for a client that left"
                await asyncio.sleep(0.02)
    finally:
        await proxy.stop()
    record = proxy.books["llama"].recent()[-1]
    assert record.outcome == "abandoned" and 3 <= record.token_events < 100 and record.ttft_s is not None


def test_enginetop_proxy_passes_the_keys_answers_and_writes_the_key_nowhere(tmp_path):
    key = "sk-proxy-test-" + os.urandom(8).hex()
    key_file = tmp_path / "llama.key"
    key_file.write_text(key + "\n")
    hostport, keyed_launched = start_keyed_llama(key_file)
    keyed_url = f"http://{hostport}"
    port = free_port()
    trace = tmp_path / "out" / "keyed.jsonl"
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    argv = [sys.executable, "-m", "tui", "proxy", "--engine", f"keyed={keyed_url}", "--listen",
            f"127.0.0.1:{port}", "--trace", str(trace), "--capture-content"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        until(lambda: _answers(url), "the proxy to listen", timeout=20)
        body = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}
        without = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
        direct = httpx.post(keyed_url + "/v1/chat/completions", json=body, timeout=60)
        assert without.status_code == direct.status_code == 401 and without.content == direct.content
        with_key = httpx.post(url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60,
                              headers={"Authorization": f"Bearer {key}"})
        assert with_key.status_code == 200 and "data: [DONE]" in with_key.text
        metrics = httpx.get(url + "/enginetop/metrics").text
        assert 'status="401"' in metrics and 'status="200"' in metrics
        until(lambda: trace.exists() and trace.read_text().count("\n") == 1, "the traced line")
        recording = tmp_path / "out" / f"keyed{SUFFIX}"  # a headless recording of the proxy's figures
        recorded = subprocess.run(
            [sys.executable, "-m", "tui", "record", "--engine", f"keyed={keyed_url}", "--api-key-file",
             f"keyed={key_file}", "--traffic", url, "--duration", "3", "--status-every", "1", "-o",
             str(recording)], env=env, capture_output=True, text=True, timeout=60)
        assert recorded.returncode == 0, recorded.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        stop_group(keyed_launched)
    assert proc.returncode == 0, err
    assert "stopped after 2 requests, 1 traced" in err
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != key_file]
    assert {p.name for p in written} >= {"keyed.jsonl", "keyed.jsonl.meta.json", "keyed.jsonl.content.jsonl",
                                         "trace-key"}
    for path in written:
        assert key not in path.read_text(errors="replace"), path
    assert key not in out + err + metrics + recorded.stdout + recorded.stderr
    rows = list(Recording(recording).rows())
    traffic = [r.item for r in rows if r.kind == "traffic"]
    assert traffic and traffic[-1].name == "keyed" and traffic[-1].stats.total_requests == 2
    assert traffic[-1].stats.total_errors == 1  # the 401
    assert all(key not in repr(r.item) for r in rows)
    assert "Say hi" in (trace.parent / "keyed.jsonl.content.jsonl").read_text()  # --capture-content
    assert "Say hi" not in trace.read_text()
    assert oct((tmp_path / "config" / "enginetop" / "trace-key").stat().st_mode & 0o777) == "0o600"


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/enginetop/traffic", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


async def test_the_dashboard_runs_the_proxy_shows_its_traffic_and_records_it(llama_server, tmp_path):
    target = EngineTarget("llama", llama_server.url)
    app = make_app([target], tmp_path)
    app.config.proxy = proxy_options("llama", tmp_path)
    path = tmp_path / f"traffic{SUFFIX}"
    recorder = Recorder(path)
    app.config.recorder = recorder
    app.__init__(app.config)  # the sources are built from the config when the app is made
    body = {"messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 16, "stream": True,
            "ignore_eos": True}
    async with app.run_test(size=(160, 60)) as pilot:
        await wait_for(pilot, lambda: app.run_sources.proxy and app.run_sources.proxy._runners,
                       what="the proxy listening")
        via = app.run_sources.proxy.routes[0].proxy_url
        ttft_chart = app.query_one("#plot-ttft")
        empty = "TTFT p50: llama.cpp has none; probes/proxy fill it"
        await wait_for(pilot, lambda: ttft_chart.shown and empty in ttft_chart.shown[0].title,
                       what="the empty TTFT chart saying what would fill it")
        async with httpx.AsyncClient(timeout=120) as client:
            for _ in range(3):
                await stream_events(client, via, body)
        await wait_for(pilot, lambda: "traffic TTFT" in screen_text(app), timeout=20, what="traffic rows")
        state = app.store.engines["llama"]
        await wait_for(pilot, lambda: state.traffic and state.traffic.stats.requests == 3, what="3 requests")
        text = screen_text(app)
        assert "req/s" in text and "tok/s per request" in text
        # llama.cpp has no per-request series: the column's request line is the proxy's, and says so
        await wait_for(pilot, lambda: state.stats.requests is not None and state.stats.requests.ended == 3,
                       what="the proxy's per-request figures in the engine's stats")
        lives = state.stats.requests
        assert lives.origin == "proxy" and lives.finish_window == (("length", 3.0),)
        assert state.stats.requests.gen_len is not None and state.stats.requests.gen_len[0] == 16
        await wait_for(pilot, lambda: "proxy reqs" in screen_text(app), what="the proxy's request line")
        await wait_for(pilot, lambda: ttft_chart.shown[0].lines.get("llama traffic", ([], []))[1],
                       what="the clients' TTFT on the chart")
        assert ttft_chart.shown[0].title.startswith("TTFT p50: engine or proxy (lines)")
        assert "length 100%" in screen_text(app)
        await wait_for(pilot, lambda: recorder.rows > 5, what="rows recorded")
    recorder.close()
    rows = [r for r in Recording(path).rows() if r.kind == "traffic"]
    assert rows and rows[-1].source == "llama" and rows[-1].item.stats.total_requests == 3
    assert rows[-1].item.stats.per_request.finish_total == (("length", 3.0),)  # recorded and read back
    page = render_recording(Recording(path))  # the report's requests table has llama.cpp's, from the proxy
    requests_table = page.split("Requests, as the engines timed them", 1)[1].split("</table>", 1)[0]
    assert "llama" in requests_table and "length 3" in requests_table
    replay = ReplayApp(Recording(path), start=rows[-1].t)  # the replay shows the traffic as it was
    async with replay.run_test(size=(160, 60)) as pilot:
        await wait_for(pilot, lambda: "traffic TTFT" in screen_text(replay), what="traffic in the replay")


async def test_each_requests_life_through_the_proxy_is_what_the_answers_said(llama_server, tmp_path):
    """llama.cpp publishes no per-request series: the proxy's stand in, in the same shape as vLLM's
    (finish reasons, lengths, prefill and decode from llama.cpp's own timings), equal to what each answer
    said, over HTTP for a dashboard watching a separate proxy too."""
    proxy = build_proxy(proxy_options("llama", tmp_path), [EngineTarget("llama", llama_server.url)])
    await proxy.start()
    via = proxy.routes[0].proxy_url
    said: list[tuple[str, int, int, float, float]] = []  # reason, prompt, generated, prompt ms, decode ms
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            asks = [({"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": n,
                      "ignore_eos": True}, stream) for n, stream in ((5, False), (9, True), (12, False))]
            # a stop word every story reaches within the first words: the engine ends it "stop"
            asks += [({"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 200,
                       "stop": ["e", "a"]}, stream) for stream in (False, True)]
            for body, stream in asks:
                if stream:
                    events = await stream_events(client, via, {**body, "stream": True})
                    objs = [o for e in events if (o := event_json(e + b"\n\n"))]
                    reason = next(c["finish_reason"] for o in objs for c in o.get("choices") or ()
                                  if c.get("finish_reason"))
                    timings = next(o["timings"] for o in reversed(objs) if "timings" in o)
                else:
                    answer = (await client.post(via + "/v1/chat/completions", json=body)).json()
                    reason, timings = answer["choices"][0]["finish_reason"], answer["timings"]
                said.append((reason, timings["prompt_n"] + timings.get("cache_n", 0), timings["predicted_n"],
                             timings["prompt_ms"], timings["predicted_ms"]))
        lives = proxy.samples()[0].stats.per_request
        assert lives is not None and lives.origin == "proxy" and lives.ended == 5
        reasons = sorted({r for r, *_ in said})
        assert reasons == ["length", "stop"]  # both ways of ending were exercised
        assert dict(lives.finish_window) == {r: float(sum(1 for x, *_ in said if x == r)) for r in reasons}
        assert lives.finish_total == lives.finish_window
        generated = [g for _, _, g, _, _ in said]
        assert lives.gen_len is not None and lives.gen_len[0] == pytest.approx(sum(generated) / 5)
        prompts = [p for _, p, *_ in said]
        assert lives.prompt_len is not None and lives.prompt_len[0] == pytest.approx(sum(prompts) / 5)
        assert lives.prefill_s is not None and lives.decode_s is not None and lives.e2e_s is not None
        decode = sorted(d / 1000 for *_, d in said)
        assert lives.decode_s[0] == pytest.approx(decode[2])  # the median of five is the third
        assert lives.prefill_s[0] == pytest.approx(sorted(p / 1000 for *_, p, _ in said)[2])
        assert lives.e2e_s[0] is not None and lives.e2e_s[0] >= decode[2]  # the client waited for all of it
        # a dashboard reading this proxy from another process gets the same figures
        remote = RemoteTraffic(via)
        try:
            sample = (await remote.read())[0]
        finally:
            await remote.aclose()
        assert sample.error is None and sample.stats.per_request is not None
        assert sample.stats.per_request.finish_window == lives.finish_window
        assert sample.stats.per_request.gen_len == lives.gen_len
    finally:
        await proxy.stop()
