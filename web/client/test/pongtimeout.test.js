// A gateway that stops answering without closing: the client against a
// real gateway behind a TCP proxy that freezes its connections, as a
// gateway stopped by SIGSTOP or a long pause, or one cut off by a
// partition, would be. The stack's TTL is 8 s, so that the renewal
// interval (2 s) sets the ping timeout rather than its 2 s floor: a busy
// user is on a new connection well before the deadline the last pong
// gave, and is never guided.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';

import { StillThere } from '../stillthere.js';
import { startStack } from '../../teststack/stack.js';
import { busyUntil, freezableProxy, memoryStorage, record, sleep, spySocket, uid } from './helpers.js';

describe('a gateway that stops answering', () => {
  let stack;
  let proxy;
  const clients = [];
  const watchers = [];
  before(async () => {
    stack = await startStack({ ttl: '8s' });
    proxy = await freezableProxy(stack.gateway);
  });
  after(async () => {
    clients.forEach((c) => c.stop());
    watchers.forEach((w) => w.close());
    proxy?.close();
    await stack?.stop();
  });

  it('reconnects once a ping goes unanswered, and its busy user is never guided', async (t) => {
    const user = uid('frozen');
    const token = await stack.token(user);
    // Beside the client, straight to the gateway, a connection of the
    // same user that never pings: it is sent every guide the user is.
    const guides = [];
    const watcher = new WebSocket(`${stack.gateway}?token=${token}`);
    watchers.push(watcher);
    watcher.onmessage = (e) => {
      const f = JSON.parse(e.data);
      if (f.type === 'guide') guides.push(f);
    };
    await new Promise((resolve, reject) => {
      watcher.onopen = resolve;
      watcher.onerror = () => reject(new Error('the watcher could not connect'));
    });

    const spy = spySocket();
    const c = new StillThere({ url: proxy.url, token, WebSocket: spy.SpySocket, storage: memoryStorage(), activityTarget: null });
    clients.push(c);
    const rec = record(c);
    c.start();
    // The user types on, every 300 ms, through the whole test.
    let done;
    const busy = busyUntil(c, new Promise((resolve) => { done = resolve; }));
    try {
      // Two pongs: the TTL is known, and with it the interval (2 s).
      const pong = await rec.waitFor('pong', () => rec.of('pong').length >= 2);
      assert.ok(pong.ttlMs >= stack.ttlMs, `ttl ${pong.ttlMs}`);
      const interval = Math.floor(pong.ttlMs / 4);
      const timeout = Math.max(2_000, interval);
      // The gateway freezes: the connection stays up, nothing comes back.
      assert.equal(proxy.freeze(), 1);
      const deadline = c.deadline; // what the last answered ping gave
      const pongs = rec.of('pong').length;

      // The next ping goes into the silence; after the timeout the
      // client drops the connection and reconnects on the backoff.
      const told = await rec.waitFor('statechange', (e) => e.state === 'reconnecting', interval + timeout + 10_000);
      assert.equal(told.code, 1006);
      assert.equal(told.reason, 'no answer to ping');
      const silent = spy.sent.filter((s) => s.frame.type === 'ping' && s.at < told.at).at(-1);
      const waited = told.at - silent.at;
      assert.ok(waited >= timeout - 20, `dropped ${waited} ms after the ping, before the ${timeout} ms timeout`);
      const open = await rec.waitFor('statechange', (e) => e.state === 'open' && e.at > told.at, told.retryIn + 10_000);
      assert.equal(spy.sockets.length, 2);

      // Its first ping on the new connection tells the activity the
      // silent ping carried, and renews the session.
      const url = new URL(spy.sockets[1].url);
      assert.equal(url.searchParams.get('first'), 'ping');
      const first = spy.sent.find((s) => s.at >= open.at);
      assert.equal(first.frame.type, 'ping');
      assert.ok(Number.isInteger(first.frame.active_ago_ms), JSON.stringify(first.frame));
      const renewed = await rec.waitFor('pong', () => rec.of('pong').length > pongs);
      assert.ok(renewed.deadline > deadline, `renewed to ${renewed.deadline}, the frozen one's deadline ${deadline}`);
      // On a busy machine the reconnect may come late; measured, to tell
      // by how much it beat the deadline.
      const beat = deadline - renewed.at;
      t.diagnostic(`dropped ${waited} ms after the unanswered ping (timeout ${timeout}), reconnected after ${open.at - told.at} ms (retryIn ${told.retryIn}), renewed ${beat} ms before the deadline`);
      assert.ok(beat > 0, `renewed ${-beat} ms after the deadline ${deadline}`);

      // Past the frozen connection's deadline, its jitter and the time
      // a guide takes: the user, busy all along, was guided nowhere.
      // Real time must pass here: the gateway guides only after it.
      await sleep(deadline + stack.jitterMs + 3_000 - Date.now());
      assert.deepEqual(guides, [], 'a guide for a user who typed all along');
      assert.deepEqual(rec.of('guide'), []);
      assert.deepEqual(rec.of('superseded'), []);
      assert.equal(c.state, 'open');
      assert.equal(spy.sockets.length, 2, 'reconnected again');
    } finally {
      done();
      await busy;
    }
  });
});
