// Unit tests of the client library on Node's test runner: its pure parts
// alone, the rest against a real gateway (a test stack with a 2 s TTL and a
// close stage 3 s after the reminder).
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';

import { StillThere, backoffDelay, closeAction, refreshDelay, tokenExpiry } from '../stillthere.js';
import { startStack } from '../../teststack/stack.js';
import { busyUntil, memoryStorage, record, scriptedSocket, sleep, spySocket, uid } from './helpers.js';

describe('closeAction', () => {
  for (const [code, want] of [
    [1001, 'now'],
    [1008, 'backoff'],
    [1013, 'backoff'],
    [4001, 'token'],
    [4000, 'stop'],
    [1006, 'retry'],
    [1000, 'retry'],
    [1009, 'retry'],
  ]) {
    it(`${code}: ${want}`, () => assert.equal(closeAction(code), want));
  }
});

describe('backoffDelay', () => {
  const backoff = { initial: 500, max: 30_000 };
  for (const [step, random, want] of [
    [0, 0, 0],
    [0, 0.5, 250],
    [0, 0.999, 499],
    [1, 0.999, 999],
    [3, 0.5, 2000],
    [6, 0.999, 29_970], // 500 * 64 is past the max
    [60, 0.5, 15_000], // no overflow however long the outage
  ]) {
    it(`step ${step}, random ${random}: ${want} ms`, () => {
      assert.equal(backoffDelay(step, backoff, () => random), want);
    });
  }
});

describe('refreshDelay', () => {
  for (const [left, random, want] of [
    [3_600_000, 0, 3_540_000], // a minute before the hour is up
    [3_600_000, 0.999, 3_569_970], // up to half a minute later
    [100_000, 0, 50_000], // less than two minutes left: at half
    [100_000, 0.999, 74_975], // to a quarter left
    [0, 0.5, 0],
    [-5_000, 0.5, 0], // expired: at once
  ]) {
    it(`${left} ms left, random ${random}: ${want} ms`, () => {
      assert.equal(refreshDelay(left, 60_000, () => random), want);
    });
  }
});

describe('tokenExpiry', () => {
  it('reads exp from a JWT, in ms', () => {
    const payload = Buffer.from(JSON.stringify({ sub: 'a', exp: 1795402852 })).toString('base64url');
    assert.equal(tokenExpiry(`e30.${payload}.sig`), 1795402852000);
  });
  for (const bad of ['', 'nodots', 'a.!!!.c', `a.${Buffer.from('{"exp":"soon"}').toString('base64url')}.c`]) {
    it(`null for ${JSON.stringify(bad)}`, () => assert.equal(tokenExpiry(bad), null));
  }
});

describe('options', () => {
  const ok = { url: 'ws://127.0.0.1:1/v1/ws', token: 't', WebSocket: class {} };
  for (const [name, change, want] of [
    ['no url', { url: undefined }, /url: "undefined", want a ws:\/\/ or wss:\/\/ URL/],
    ['http url', { url: 'http://x/v1/ws' }, /url: "http:\/\/x\/v1\/ws", want a ws:\/\/ or wss:\/\/ URL/],
    ['empty token', { token: '' }, /token: "", want a token or a function/],
    ['numeric token', { token: 7 }, /token: number/],
    ['ping interval under a second', { pingInterval: 200 }, /pingInterval: 200, want 0 \(from the TTL\) or at least 1000 ms/],
    ['pong timeout under a second', { pongTimeout: 500 }, /pongTimeout: 500, want 0 \(from the TTL\) or at least 1000 ms/],
    ['pong timeout not a number', { pongTimeout: '2s' }, /pongTimeout: 2s, want a number of ms/],
    ['negative pong timeout', { pongTimeout: -1 }, /pongTimeout: -1, want a number of ms/],
    ['negative refreshBefore', { refreshBefore: -1 }, /refreshBefore: -1/],
    ['backoff max under initial', { backoff: { initial: 1000, max: 10 } }, /backoff: \{"initial":1000,"max":10\}/],
    ['activityEvents not a list', { activityEvents: 'keydown' }, /activityEvents: keydown/],
  ]) {
    it(`refuses ${name}, naming it`, () => {
      assert.throws(() => new StillThere({ ...ok, ...change }), want);
    });
  }
});

describe('a ping without an answer', () => {
  // A scripted gateway and mocked timers and clock: each wait is exact,
  // and no test waits in real time.
  const flush = async () => {
    for (let i = 0; i < 10; i++) await new Promise((resolve) => setImmediate(resolve));
  };
  function rig(t, answer, options = {}) {
    t.mock.timers.enable({ apis: ['setTimeout', 'Date'], now: 1_000_000 });
    const gw = scriptedSocket(answer);
    const c = new StillThere({
      url: 'ws://127.0.0.1:1/v1/ws',
      token: 't',
      WebSocket: gw.ScriptedSocket,
      storage: null,
      activityTarget: null,
      random: () => 0.5,
      ...options,
    });
    t.after(() => c.stop());
    const rec = record(c);
    return {
      c,
      rec,
      sockets: gw.sockets,
      pings: (i) => gw.sockets[i].sent.filter((s) => s.frame.type === 'ping'),
      reconnects: () => rec.of('statechange').filter((e) => e.state === 'reconnecting'),
      // Runs what is due within ms of the clock, and the client's
      // promises and answers in between.
      async advance(ms) {
        await flush();
        t.mock.timers.tick(ms);
        await flush();
      },
    };
  }
  // The first socket answers only its first ping; later ones, every ping.
  const silentAfterFirst = (ttlMs) => (f, ws) => {
    if (f.type !== 'ping') return;
    if (ws.url.searchParams.get('first') === null && ws.sent.length > 1) return;
    ws.reply({ type: 'pong', ttl_ms: ttlMs });
  };

  it('drops the connection after the renewal interval, and reconnects with the activity owed', async (t) => {
    // TTL 12 s: an interval of 3 s, and a timeout as long.
    const r = rig(t, silentAfterFirst(12_000));
    r.c.start();
    await r.advance(0);
    assert.equal(r.rec.of('pong').length, 1);
    await r.advance(100);
    const activeAt = Date.now();
    r.c.activity(); // owed a ping, at the interval's end
    await r.advance(2_900);
    assert.equal(r.pings(0).length, 2, 'the owed ping');
    await r.advance(2_999);
    assert.deepEqual(r.reconnects(), [], 'dropped before the timeout');
    await r.advance(1);
    const told = r.reconnects();
    assert.equal(told.length, 1, 'not dropped at the timeout');
    assert.equal(told[0].code, 1006);
    assert.equal(told[0].reason, 'no answer to ping');
    assert.equal(told[0].retryIn, 250, "the backoff's first step");
    // Closed without 1000, which would end the session at a gateway
    // that wakes up.
    assert.notEqual(r.sockets[0].closed, null, 'the silent socket left open');
    assert.equal(r.sockets[0].closed.code, undefined);

    await r.advance(250);
    assert.equal(r.sockets.length, 2);
    // The silent ping's activity: told first on the new connection.
    assert.equal(r.sockets[1].url.searchParams.get('first'), 'ping');
    assert.deepEqual(r.sockets[1].sent[0].frame, { type: 'ping', active_ago_ms: Date.now() - activeAt });
    assert.equal(r.rec.of('pong').length, 2, 'the new connection renewed nothing');
    assert.equal(r.c.state, 'open');
  });

  for (const [name, ttlMs, pongTimeout, want] of [
    ['a quarter of the TTL', 40_000, 0, 10_000],
    ['at least 2 s', 4_000, 0, 2_000],
    ['at most 30 s, as the interval', 600_000, 0, 30_000],
    ['pongTimeout when set', 12_000, 1_500, 1_500],
  ]) {
    it(`waits ${name}`, async (t) => {
      const r = rig(t, silentAfterFirst(ttlMs), { pongTimeout });
      r.c.start();
      await r.advance(100);
      r.c.activity();
      await r.advance(Math.min(30_000, Math.max(1_000, ttlMs / 4)) - 100);
      assert.equal(r.pings(0).length, 2);
      await r.advance(want - 1);
      assert.deepEqual(r.reconnects(), []);
      await r.advance(1);
      assert.equal(r.reconnects().length, 1, `no reconnect ${want} ms after the ping`);
    });
  }

  it('takes an unavailable error as an answer: a gateway that cannot renew keeps its connection', async (t) => {
    // The session store is out: every ping after the first is answered
    // with unavailable, a second after it left. The timeout is 3 s, and
    // the pings an interval (3 s) after each answer: a wait that ran on
    // past the error would end the connection before the next ping.
    const r = rig(t, (f, ws) => {
      if (f.type !== 'ping') return;
      if (ws.sent.length === 1) ws.reply({ type: 'pong', ttl_ms: 12_000 });
      else setTimeout(() => ws.reply({ type: 'error', code: 'unavailable', message: 'ping again' }), 1_000);
    });
    r.c.start();
    await r.advance(0);
    for (let i = 0; i < 60; i++) {
      r.c.activity(); // the user types on
      await r.advance(500);
    }
    assert.ok(r.pings(0).length >= 7, `${r.pings(0).length} pings in 30 s`);
    assert.ok(r.rec.of('error').every((e) => e.code === 'unavailable'));
    // Each answered but the first (a pong) and maybe the last (on its way).
    assert.ok(r.rec.of('error').length >= r.pings(0).length - 2, `${r.rec.of('error').length} errors`);
    assert.deepEqual(r.reconnects(), [], 'reconnected on an answer');
    assert.equal(r.sockets.length, 1);
    assert.equal(r.c.state, 'open');
  });
});

describe('against a real gateway', { concurrency: true }, () => {
  // Clients, recording events and frames; all stopped after the tests,
  // before the stack.
  const clients = [];
  let stack;
  before(async () => {
    stack = await startStack();
  });
  after(async () => {
    clients.forEach((c) => c.stop());
    await stack?.stop();
  });

  function client(options, spyOptions) {
    const spy = spySocket(spyOptions);
    const c = new StillThere({ url: stack.gateway, WebSocket: spy.SpySocket, storage: memoryStorage(), ...options });
    clients.push(c);
    return { c, spy, rec: record(c) };
  }

  it('connects, pings on activity at most once per interval, and never on a bare timer', async () => {
    const { c, spy, rec } = client({ token: await stack.token(uid('pinger')) });
    c.start();
    await rec.waitFor('statechange', (e) => e.state === 'open');
    assert.deepEqual(rec.of('statechange').map((e) => e.state), ['connecting', 'open']);
    // Opening the chat is activity: one ping, answered.
    const pong = await rec.waitFor('pong');
    assert.ok(pong.ttlMs >= stack.ttlMs && pong.ttlMs <= stack.ttlMs + stack.jitterMs, `ttl ${pong.ttlMs}`);
    assert.equal(c.deadline, pong.deadline);

    // A burst of activity: one ping at once (the interval since the last
    // has passed), then one at the end of the interval, for the rest.
    await sleep(1100);
    const burst = Date.now();
    for (let i = 0; i < 20; i++) {
      c.activity();
      await sleep(10);
    }
    await sleep(1500);
    const pings = spy.frames('ping').filter((p) => p.at >= burst);
    assert.equal(pings.length, 2, `pings after the burst: ${JSON.stringify(pings)}`);
    assert.ok(pings[1].at - pings[0].at >= 1000, `pings ${pings[1].at - pings[0].at} ms apart, want at least the interval`);

    // Then nothing: no ping without activity, whatever the time.
    const quiet = spy.frames('ping').length;
    await sleep(1500);
    assert.equal(spy.frames('ping').length, quiet, 'a ping without activity');
  });

  it('spaces pings from the answer to the last, so that each one renews, even over a slow uplink', async () => {
    // The first ping takes longer to get there than the ping interval
    // (1 s before any grant): a second ping spaced from the first's
    // sending, not its answer, would leave beside it.
    const { c, spy, rec } = client({ token: await stack.token(uid('slowlink')) }, { delayFirst: 1500 });
    c.start();
    await rec.waitFor('statechange', (e) => e.state === 'open');
    // Activity while the first ping is on its way: owed a second ping,
    // which the gateway must take at least its granularity (1 s) after
    // the first, or it answers from the first grant and renews nothing.
    await sleep(100);
    c.activity();
    const [first, second] = [await rec.waitFor('pong'), await rec.waitFor('pong', () => rec.of('pong').length >= 2)];
    assert.ok(second.deadline > first.deadline, `deadlines ${first.deadline}, then ${second.deadline}`);
    // The second ping left once the first was answered, never beside it.
    const pings = spy.frames('ping');
    assert.equal(pings.length, 2);
    assert.ok(pings[1].at >= first.at, `second ping ${first.at - pings[1].at} ms before the first was answered`);
    // And the gateway renewed on it: a ping answered from another's
    // renewal gets that renewal's deadline. Judged by this connection's
    // own pongs (its user has no other), not by the gateway's count of
    // shared renewals, which other tests' users add to: these tests run
    // at once, and a user's devices share renewals by design.
    const pongs = spy.receivedFrames('pong').map((p) => p.frame.deadline_ms);
    assert.equal(pongs.length, 2);
    assert.ok(pongs[1] > pongs[0], `the gateway's deadlines ${pongs[0]}, then ${pongs[1]}: the second ping renewed nothing`);
  });

  it('keeps a busy user out of the guide, and guides them once they go quiet', async () => {
    const { c, spy, rec } = client({ token: await stack.token(uid('typist')) });
    c.start();
    await rec.waitFor('pong');
    // Busy for twice the TTL and then some: never guided.
    const until = Date.now() + 2 * (stack.ttlMs + stack.jitterMs);
    while (Date.now() < until) {
      c.activity();
      await sleep(150);
    }
    assert.equal(rec.of('guide').length, 0, 'a busy user was guided');
    // Quiet: the reminder once, acked, then the close stage, and the
    // client stops there.
    const guide = await rec.waitFor('guide');
    const lastPing = spy.frames('ping').at(-1).at;
    assert.equal(guide.stage, 1);
    assert.equal(guide.final, false);
    assert.match(guide.text, /still there/i);
    assert.ok(guide.deadline >= lastPing + stack.ttlMs - 50, `deadline ${guide.deadline - lastPing} ms after the last ping`);
    assert.ok(spy.frames('ack').some((a) => a.frame.id === guide.id), 'the guide was not acked');
    const close = await rec.waitFor('guide', (g) => g.final);
    assert.equal(close.stage, 2);
    const closed = await rec.waitFor('statechange', (e) => e.state === 'closed');
    assert.equal(closed.code, 4000);
    assert.equal(closed.reason, 'inactive');
    await sleep(1000);
    assert.equal(spy.sockets.length, 1, 'reconnected after 4000');
    assert.equal(c.state, 'closed');
    assert.equal(rec.of('guide').length, 2);
  });

  it('shows a guide once per id, across duplicate frames and reconnects', async () => {
    const user = uid('dedup');
    const storage = memoryStorage();
    const first = client({ token: await stack.token(user), storage });
    first.c.start();
    await first.rec.waitFor('pong');
    const id = `guide-${user}`;
    assert.equal(await stack.pushGuide({ id, uid: user, text: 'Still with us?' }), 'delivered');
    const shown = await first.rec.waitFor('guide');
    assert.deepEqual({ ...shown, at: 0 }, { type: 'guide', at: 0, id, text: 'Still with us?', stage: 1, final: false, deadline: null });
    // The same frame again (a resend, a second delivery): acked, not shown.
    const frame = JSON.stringify({ type: 'guide', id, text: 'Still with us?', stage: 1, final: false });
    first.spy.sockets[0].replay(frame);
    await sleep(100);
    assert.equal(first.rec.of('guide').length, 1);
    assert.equal(first.spy.frames('ack').length, 2);

    // A new client on the same storage (a reload, another page of the
    // site in this tab) does not show it either; one on other storage does.
    const again = client({ token: await stack.token(user), storage });
    const fresh = client({ token: await stack.token(user) });
    for (const x of [again, fresh]) {
      x.c.start();
      await x.rec.waitFor('statechange', (e) => e.state === 'open');
      x.spy.sockets[0].replay(frame);
    }
    await sleep(100);
    assert.equal(again.rec.of('guide').length, 0, 'shown again after a reconnect');
    assert.equal(fresh.rec.of('guide').length, 1);
  });

  it('drops a guide whose silence began while its user was active and unheard', async () => {
    // Activity the gateway has not heard of yet (the next ping waits for
    // its interval, or the network is gone) keeps the user there, by the
    // client's record, for a TTL after it: a guide of a silence that ran
    // out meanwhile came from a gateway that did not know, and is not
    // shown. One of the deadline the gateway gave, or one that does not
    // say its deadline, is.
    const { c, spy, rec } = client({ token: await stack.token(uid('unheard')), pingInterval: 60_000 });
    c.start();
    const pong = await rec.waitFor('pong');
    // Real time must pass: the activity comes well after the ping.
    await sleep(700);
    const active = Date.now();
    c.activity();
    assert.equal(spy.frames('ping').length, 1, 'the activity waits for the interval');
    const ws = spy.sockets[0];
    const guide = (id, deadline) => ws.replay(JSON.stringify({ type: 'guide', id, text: 'Still there?', stage: 1, final: false, ...(deadline ? { deadline_ms: deadline } : {}) }));
    guide('within', pong.deadline + 300);
    guide('after', active + pong.ttlMs + 1000); // a silence after the run
    guide('undated', null);
    const ours = (type) => rec.of(type).map((g) => g.id).filter((id) => ['within', 'after', 'undated'].includes(id));
    assert.deepEqual(ours('guide'), ['after', 'undated']);
    assert.deepEqual(ours('superseded'), ['within']);
    assert.equal(spy.frames('ack').length, 3, 'every copy is acked');
  });

  it('a close stage handed over from the inbox leaves the user back on their connection', async () => {
    // The chat closed while the user had no connection: its guide waits
    // in their inbox, and on their next connect closes nothing.
    const user = uid('inbox');
    const id = `close-${user}`;
    const status = await stack.pushGuide({ id, uid: user, text: 'We closed this chat.', stage: 2, action: 'close', final: true });
    assert.equal(status, 'queued');
    const { c, rec } = client({ token: await stack.token(user) });
    c.start();
    const closed = await rec.waitFor('guide');
    assert.equal(closed.final, true);
    // Back: their activity renews a new session on the same connection.
    await rec.waitFor('pong');
    await sleep(1100);
    c.activity();
    await rec.waitFor('pong', () => rec.of('pong').length >= 2, 5_000);
    assert.equal(c.state, 'open');
  });

  it('ignores frames it does not know', async () => {
    const { c, spy, rec } = client({ token: await stack.token(uid('future')) });
    c.start();
    await rec.waitFor('pong');
    spy.sockets[0].replay('{"type":"hologram","id":"x"}');
    spy.sockets[0].replay('[1,2]');
    spy.sockets[0].replay('not json');
    await sleep(50);
    assert.equal(rec.of('error').length, 0);
    assert.equal(c.state, 'open');
  });

  it('reconnects at once when its gateway restarts (1001)', async () => {
    const { c, rec } = client({ url: stack.restartable, token: await stack.token(uid('deploy')) });
    c.start();
    await rec.waitFor('pong');
    const restarted = stack.restart();
    const told = await rec.waitFor('statechange', (e) => e.state === 'reconnecting');
    assert.equal(told.code, 1001);
    assert.ok(told.retryIn < 500, `waits ${told.retryIn} ms`);
    await restarted;
    await rec.waitFor('statechange', (e) => e.state === 'open' && e.at > told.at, 10_000);
    // The user comes back: the new instance renews the session.
    const pongs = rec.of('pong').length;
    c.activity();
    await rec.waitFor('pong', () => rec.of('pong').length > pongs);
  });

  it('backs off when the gateway closes with 1008 (over the rate limit)', async () => {
    const { c, spy, rec } = client({
      token: await stack.token(uid('flood')),
      backoff: { initial: 100, max: 30_000 },
      random: () => 0.99,
    });
    c.start();
    await rec.waitFor('pong');
    // Behind the client's back: more frames than the rate limit's burst.
    for (let i = 0; i < 30; i++) spy.sockets[0].send('{"type":"ack","id":"x"}');
    const told = await rec.waitFor('statechange', (e) => e.state === 'reconnecting');
    assert.equal(told.code, 1008);
    // The fourth step of the backoff at least: 100 ms * 2^3 window.
    assert.equal(told.retryIn, Math.floor(0.99 * 800));
    const back = await rec.waitFor('statechange', (e) => e.state === 'open' && e.at > told.at);
    assert.ok(back.at - told.at >= told.retryIn - 5, `back after ${back.at - told.at} ms`);
  });

  it('backs off while its user holds the most connections the gateway takes of one user (429)', async () => {
    // A browser sees a refused upgrade as a dropped connection (1006),
    // whatever its status: the client retries on the growing backoff,
    // never at once, and connects once one of the user's places is free.
    const tok = await stack.token(uid('devices'));
    const held = [];
    for (let i = 0; i < 10; i++) { // the gateway's default max-user-conns
      const ws = new WebSocket(`${stack.gateway}?token=${tok}`);
      await new Promise((resolve, reject) => {
        ws.onopen = resolve;
        ws.onerror = () => reject(new Error(`device ${i} refused`));
      });
      held.push(ws);
    }
    const { c, rec } = client({ token: tok, backoff: { initial: 100, max: 30_000 }, random: () => 0.99 });
    c.start();
    const waits = () => rec.of('statechange').filter((e) => e.state === 'reconnecting').map((e) => e.retryIn);
    await rec.waitFor('statechange', () => waits().length >= 3);
    // Windows of 100, 200 and 400 ms: each refusal doubles the wait.
    assert.deepEqual(waits().slice(0, 3), [99, 198, 396]);
    assert.ok(!rec.of('statechange').some((e) => e.state === 'open'), 'connected past the limit');
    held.pop().close();
    await rec.waitFor('statechange', (e) => e.state === 'open', 15_000);
    held.forEach((ws) => ws.close());
  });

  it('refreshes its token through the auth frame, and outlives the first one', async () => {
    const user = uid('refresh');
    const reasons = [];
    const { c, spy, rec } = client({
      token: ({ reason }) => {
        reasons.push(reason);
        return stack.token(user, { ttl: '3s' });
      },
    });
    c.start();
    await rec.waitFor('pong');
    const refreshed = await rec.waitFor('token');
    assert.ok(refreshed.expires > Date.now(), 'auth_ok expires in the past');
    // Past the first token's exp and the gateway's 5 s leeway: still on
    // the first socket. The user types meanwhile: an auth frame renews
    // no session, and an idle user's chat would close.
    await busyUntil(c, sleep(3000 + 5000 + 1000));
    assert.equal(spy.sockets.length, 1, 'reconnected');
    assert.equal(c.state, 'open');
    assert.deepEqual(reasons.slice(0, 2), ['connect', 'refresh']);
    assert.ok(spy.frames('auth').length >= 2);
    assert.equal(rec.of('error').length, 0, JSON.stringify(rec.of('error')));
  });

  it('keeps its connection when the gateway refuses a fresh token (bad_token)', async () => {
    const user = uid('badtoken');
    const { c, rec } = client({
      token: ({ reason }) => stack.token(reason === 'refresh' ? `${user}-other` : user, { ttl: '2s' }),
    });
    c.start();
    await rec.waitFor('pong');
    const err = await rec.waitFor('error');
    assert.equal(err.code, 'bad_token');
    assert.match(err.message, /another user/);
    assert.equal(c.state, 'open');
  });

  it('gets a fresh token and reconnects at once after 4001', async () => {
    const user = uid('expired');
    const reasons = [];
    const { c, spy, rec } = client({
      random: () => 0.5,
      token: ({ reason }) => {
        reasons.push(reason);
        // The auth server is down for refreshes: the token runs out.
        if (reason === 'refresh') throw new Error('auth server down');
        return stack.token(user, { ttl: '1s' });
      },
    });
    c.start();
    const failed = await rec.waitFor('error');
    assert.equal(failed.code, 'token_failed');
    const told = await busyUntil(c, rec.waitFor('statechange', (e) => e.code === 4001, 15_000));
    assert.equal(told.state, 'reconnecting');
    assert.equal(told.retryIn, 250, 'not at once, spread over the first 500 ms');
    await rec.waitFor('statechange', (e) => e.state === 'open' && e.at > told.at);
    assert.ok(reasons.includes('expired'), `token asked for ${reasons}`);
    assert.equal(spy.sockets.length, 2);
  });

  it('closes after 4001 when it has no way to a fresh token', async () => {
    const { c, rec } = client({ token: await stack.token(uid('static'), { ttl: '1s' }) });
    c.start();
    const closed = await busyUntil(c, rec.waitFor('statechange', (e) => e.state === 'closed' && e.code === 4001, 15_000));
    assert.equal(closed.reason, 'token expired');
    assert.equal(c.state, 'closed');
  });

  it('stop() leaves on purpose: 1000, and no guide follows', async () => {
    const user = uid('leaver');
    const { c, rec } = client({ token: await stack.token(user) });
    c.start();
    await rec.waitFor('pong');
    c.stop();
    assert.equal(c.state, 'closed');
    assert.equal(rec.of('statechange').at(-1).reason, 'stopped');
    // Past the deadline, a connection that only listens (it never pings,
    // which would start a session) sees no guide.
    const frames = [];
    const watcher = new WebSocket(`${stack.gateway}?token=${await stack.token(user)}`);
    watcher.onmessage = (e) => frames.push(JSON.parse(e.data));
    await sleep(stack.ttlMs + stack.jitterMs + 1500);
    watcher.close();
    assert.deepEqual(frames.filter((f) => f.type === 'guide'), []);
  });
});
