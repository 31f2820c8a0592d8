// Review of the client library against a real gateway: cases the unit
// tests leave out. The stack here allows tokens of any lifetime
// (STILLTHERE_TOKEN_MAX_LIFETIME=0), as a platform may configure it.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';

import { StillThere } from '../stillthere.js';
import { startStack } from '../../teststack/stack.js';
import { memoryStorage, record, sleep, spySocket, uid } from './helpers.js';

describe('review: against a real gateway', { concurrency: true }, () => {
  const clients = [];
  let stack;
  before(async () => {
    process.env.STILLTHERE_TOKEN_MAX_LIFETIME = '0';
    stack = await startStack();
  });
  after(async () => {
    clients.forEach((c) => c.stop());
    await stack?.stop();
  });

  function client(options) {
    const spy = spySocket();
    const c = new StillThere({ url: stack.gateway, WebSocket: spy.SpySocket, storage: memoryStorage(), ...options });
    clients.push(c);
    return { c, spy, rec: record(c) };
  }

  it('does not refresh a token that has a month to live', async () => {
    // 30 days is past setTimeout's 2^31-1 ms: a delay that long fires at
    // once, so the refresh must not be scheduled as one timer.
    const user = uid('month');
    const reasons = [];
    const { c, spy, rec } = client({
      token: ({ reason }) => {
        reasons.push(reason);
        return stack.token(user, { ttl: '720h' });
      },
    });
    c.start();
    await rec.waitFor('pong');
    await sleep(1500);
    assert.equal(reasons.length, 1, `token asked for ${reasons.length} times in 1.5 s: ${reasons.slice(0, 3)}...`);
    assert.equal(spy.frames('auth').length, 0, 'auth frames sent for a token a month from expiry');
    assert.equal(rec.of('statechange').filter((e) => e.code === 1008).length, 0, 'closed for the rate limit');
  });

  it('stop() while reconnecting still leaves on purpose: no guide follows', async () => {
    // README: "client.stop() when the user ends the chat (close 1000: no
    // guide follows)". The user had a session; their gateway restarted
    // (1001, the session survives) and, while the client waits to
    // reconnect, they end the chat.
    const user = uid('leaver');
    const { c, rec } = client({
      url: stack.restartable,
      token: await stack.token(user),
      backoff: { initial: 10_000, max: 30_000 },
      random: () => 0.99,
    });
    c.start();
    await rec.waitFor('pong');
    const restarted = stack.restart();
    await rec.waitFor('statechange', (e) => e.state === 'reconnecting' && e.code === 1001);
    const left = c.stop();
    await restarted;
    await left; // the gateway was told
    // The gateway ends the session once it has read the close; a
    // connection of the user's that registers before that keeps it, as
    // another device would. Give it that moment.
    await sleep(1500);
    // A connection that only listens (it never pings, which would start
    // a session) sees what the user would be sent.
    const frames = [];
    const watcher = new WebSocket(`${stack.gateway}?token=${await stack.token(user)}`);
    watcher.onmessage = (e) => frames.push(JSON.parse(e.data));
    await sleep(stack.ttlMs + stack.jitterMs + 2500);
    watcher.close();
    assert.deepEqual(frames.filter((f) => f.type === 'guide'), [], 'a guide after the user left on purpose');
  });

  it('leaves connecting after a refused upgrade (401) in Node 20', async () => {
    // Node 20's WebSocket fires error and no close when the upgrade is
    // refused; the client waits for a close that never comes.
    const { c, spy, rec } = client({ token: 'not-a-jwt', backoff: { initial: 100, max: 200 } });
    c.start();
    await sleep(2000);
    assert.ok(rec.of('statechange').some((e) => e.state === 'reconnecting'),
      `state ${c.state} 2 s after ${spy.sockets.length} refused upgrade(s)`);
  });

  it('gives up on a fixed token that has expired, as after 4001', async () => {
    // A fixed token cannot be renewed: after 4001 the client closes with
    // "token expired". A page opened with an already expired one (the
    // demo URL of yesterday's make run) is refused with 401 at every
    // upgrade, forever. SpecSocket fires close after a failed upgrade as
    // browsers do, whatever Node's WebSocket does.
    const tok = await stack.token(uid('stale'), { ttl: '1s' });
    await sleep(1000 + 5000 + 500); // past exp and the gateway's leeway
    let attempts = 0;
    class SpecSocket extends WebSocket {
      constructor(url) {
        super(url);
        attempts++;
        let closed = false;
        this.addEventListener('close', () => { closed = true; });
        this.addEventListener('error', () => setTimeout(() => {
          if (!closed) this.onclose?.({ code: 1006, reason: '' });
        }, 0));
      }
    }
    const c = new StillThere({ url: stack.gateway, token: tok, WebSocket: SpecSocket, storage: null, backoff: { initial: 100, max: 200 } });
    clients.push(c);
    const rec = record(c);
    c.start();
    await sleep(3000);
    assert.equal(c.state, 'closed', `state ${c.state} after ${attempts} refused upgrades`);
    assert.equal(rec.of('statechange').at(-1).reason, 'token expired');
  });
});
