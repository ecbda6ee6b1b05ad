"""RSocket 1.0 with rsocket-js (npm ``rsocket-core`` / ``rsocket-tcp-client``
0.0.27), unchanged: a Node script connects over TCP with simple
authentication in the SETUP metadata, appends through ``events.append``, and
reads by request-response and request-stream (``events.read``); the test
checks what it printed against the store.

The npm packages are installed by the test itself into a cache directory
under the system temp dir (bounded in time).  Without Node or npm the test is
skipped saying so; so it is when ``npm install`` cannot reach the registry.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from polyport.core.commands import ReadStream

pytestmark = pytest.mark.timeout(300)

VERSION = "0.0.27"
PACKAGES = [f"rsocket-core@{VERSION}", f"rsocket-tcp-client@{VERSION}",
            f"rsocket-flowable@{VERSION}"]
CACHE = Path(tempfile.gettempdir()) / f"polyport-rsocket-js-{VERSION}"
INSTALL_TIMEOUT = 180
USER, PASSWORD, CTX = "js-user", "js-pw", "js-ctx"

SCRIPT = r"""
const {
  RSocketClient, BufferEncoders, encodeCompositeMetadata, encodeRoute,
  encodeSimpleAuthMetadata, MESSAGE_RSOCKET_COMPOSITE_METADATA, MESSAGE_RSOCKET_ROUTING,
  MESSAGE_RSOCKET_AUTHENTICATION,
} = require('rsocket-core');
const RSocketTcpClient = require('rsocket-tcp-client').default;

const [host, port, user, password, stream] = process.argv.slice(2);
const routed = (route, obj) => ({
  data: Buffer.from(JSON.stringify(obj)),
  metadata: encodeCompositeMetadata([[MESSAGE_RSOCKET_ROUTING, encodeRoute(route)]]),
});
const single = (socket, payload) => new Promise((resolve, reject) =>
  socket.requestResponse(payload).subscribe({onComplete: resolve, onError: reject}));
const many = (socket, payload) => new Promise((resolve, reject) => {
  const got = [];
  socket.requestStream(payload).subscribe({
    onSubscribe: (s) => s.request(100),
    onNext: (p) => got.push(JSON.parse(p.data.toString())),
    onComplete: () => resolve(got),
    onError: reject,
  });
});

const client = new RSocketClient({
  setup: {
    keepAlive: 1000,
    lifetime: 30000,
    dataMimeType: 'application/json',
    metadataMimeType: MESSAGE_RSOCKET_COMPOSITE_METADATA.string,
    payload: {
      data: Buffer.alloc(0),
      metadata: encodeCompositeMetadata([
        [MESSAGE_RSOCKET_AUTHENTICATION, encodeSimpleAuthMetadata(user, password)],
      ]),
    },
  },
  transport: new RSocketTcpClient({host, port: Number(port)}, BufferEncoders),
});

client.connect().subscribe({
  onComplete: async (socket) => {
    try {
      const appended = await single(socket, routed('events.append', {
        stream, events: [
          {type: 'FromNode', body: {lang: 'js', n: 1}, headers: {via: 'rsocket-js'}},
          {type: 'FromNode', body: Buffer.from([0, 255]).toString('base64'),
           content_type: 'application/octet-stream'},
        ],
      }));
      const read = await single(socket, routed('events.read', {stream}));
      const streamed = await many(socket, routed('events.read', {stream}));
      let error = null;
      try {
        await single(socket, routed('events.nope', {}));
      } catch (e) {
        error = e.message;
      }
      console.log(JSON.stringify({
        appended: JSON.parse(appended.data.toString()),
        read: JSON.parse(read.data.toString()),
        streamed, error,
      }));
      client.close();
      process.exit(0);
    } catch (e) {
      console.error('failed: ' + (e && e.message));
      process.exit(2);
    }
  },
  onError: (e) => { console.error('connect failed: ' + e.message); process.exit(3); },
});
"""


def _install() -> Path:
    """The cache directory with the packages installed, or a pytest skip."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("Node.js and npm are not installed: the rsocket-js test needs them")
    if (CACHE / "node_modules" / "rsocket-tcp-client" / "package.json").exists():
        return CACHE
    CACHE.mkdir(parents=True, exist_ok=True)
    (CACHE / "package.json").write_text('{"private": true}\n')
    try:
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--no-save", *PACKAGES],
            check=False, cwd=CACHE, capture_output=True, text=True, timeout=INSTALL_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"npm install of rsocket-js took over {INSTALL_TIMEOUT} s (no network?)")
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
        pytest.skip(f"npm install of rsocket-js failed (no registry access?): {reason[0]}")
    return CACHE


async def test_rsocket_js_appends_and_reads(gateway_factory: Any) -> None:
    cache = _install()
    gw = await gateway_factory()
    await gw.store.users.add(USER, PASSWORD, default_context=CTX)
    host, port = gw.listeners["rsocket"].address
    script = cache / "polyport_check.js"
    script.write_text(SCRIPT)
    stream = "from-node"
    proc = await asyncio.create_subprocess_exec(
        "node", str(script), host, str(port), USER, PASSWORD, stream,
        cwd=cache, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    got = json.loads(out.decode().strip().splitlines()[-1])

    events = await gw.store.read_stream(ReadStream(CTX, stream))
    assert [(e.type, e.content_type, e.body, e.origin) for e in events] == [
        ("FromNode", "application/json", b'{"lang":"js","n":1}', "rsocket"),
        ("FromNode", "application/octet-stream", b"\x00\xff", "rsocket"),
    ]
    assert events[0].headers == {"via": "rsocket-js"}
    assert got["appended"] == {"first_version": 1, "last_version": 2,
                               "position": events[-1].position}
    for view in (got["read"]["events"], got["streamed"]):
        assert [(v["id"], v["version"], v["position"], v["context"]) for v in view] == [
            (str(e.event_id), e.version, e.position, CTX) for e in events
        ]
        assert view[0]["body"] == {"lang": "js", "n": 1}
        assert view[1]["body"] == "AP8="  # base64 of 00 ff
    # rsocket-js puts the code's name in front of the ERROR text.
    assert "0x204 (INVALID): unsupported: unknown route 'events.nope'" in got["error"]
