// Shared by the k6 scripts in this directory (smoke.js, sessions.js,
// reconnect-storm.js); not a script to run by itself. It reads the
// settings from the environment, signs client tokens, and plays one chat
// client per connection against the wire contract in docs/protocol.md:
// ping, read pongs and guides, ack guides, close 1000 to leave.

import { check } from 'k6';
import { hmac } from 'k6/crypto';
import encoding from 'k6/encoding';
import exec from 'k6/execution';
import { Counter, Trend } from 'k6/metrics';
import { WebSocket } from 'k6/websockets';

// ---------------------------------------------------------------- settings

const problems = [];

function raw(name) {
  const v = __ENV[name];
  return v === undefined || v === '' ? undefined : v;
}

// parseDuration reads Go-style durations ("15s", "1m30s", "250ms") into ms.
export function parseDuration(s) {
  const re = /(\d+(?:\.\d+)?)(ms|s|m|h)/g;
  const units = { ms: 1, s: 1000, m: 60000, h: 3600000 };
  let total = 0;
  let consumed = 0;
  let m;
  while ((m = re.exec(s)) !== null) {
    if (m.index !== consumed) return NaN;
    total += parseFloat(m[1]) * units[m[2]];
    consumed = re.lastIndex;
  }
  return consumed === s.length && consumed > 0 ? total : NaN;
}

export function envDuration(name, def, help) {
  const v = raw(name);
  if (v === undefined) return def;
  const ms = parseDuration(v);
  if (!(ms >= 0)) problems.push(`${name}=${v}: not a duration like 500ms, 15s or 2m (${help})`);
  return ms;
}

export function envInt(name, def, help) {
  const v = raw(name);
  if (v === undefined) return def;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) problems.push(`${name}=${v}: not a whole number >= 0 (${help})`);
  return n;
}

export function envFraction(name, def, help) {
  const v = raw(name);
  if (v === undefined) return def;
  const f = Number(v);
  if (!(f >= 0 && f <= 1)) problems.push(`${name}=${v}: not a fraction in [0, 1] (${help})`);
  return f;
}

export function envString(name, def) {
  const v = raw(name);
  return v === undefined ? def : v;
}

// want records a problem found by a script's own validation.
export function want(ok, message) {
  if (!ok) problems.push(message);
}

// fail stops the test before it starts, listing every problem at once.
export function failOnProblems(usage) {
  if (problems.length === 0) return;
  for (const p of problems) console.error(p);
  for (const line of usage.split('\n')) console.error(line);
  throw new Error(`${problems.length} setting(s) missing or invalid, listed above`);
}

// common reads the settings every script shares.
export function common(def) {
  const c = {
    urls: envString('GATEWAY_URL', 'ws://127.0.0.1:8080/v1/ws')
      .split(',').map((u) => u.trim()).filter((u) => u !== ''),
    secret: envString('STILLTHERE_TOKEN_SECRET', ''),
    tokensFile: envString('TOKENS_FILE', ''),
    segment: envString('SEGMENT', ''),
    tokenTTL: envDuration('TOKEN_TTL', 24 * 3600000, 'lifetime of the tokens k6 signs'),
    uidPrefix: envString('UID_PREFIX', ''),
    clients: envInt('CLIENTS', def.clients, 'connections, one user each'),
    connsPerVU: envInt('CONNS_PER_VU', def.connsPerVU, 'connections each k6 VU holds'),
    ramp: envDuration('RAMP', def.ramp, 'time over which the clients connect'),
    pingEvery: envDuration('PING_INTERVAL', def.pingEvery || 15000, 'pause between pings of an active client'),
    ttl: envDuration('STILLTHERE_SESSION_TTL', 60000, "the gateway's session TTL"),
    jitter: envDuration('STILLTHERE_SESSION_JITTER', 5000, "the gateway's session jitter"),
    guideBound: envDuration('GUIDE_BOUND', 5000, 'longest a guide may take past the deadline'),
    linger: envDuration('LINGER', 5000, 'how long a guided client keeps listening for a duplicate'),
  };
  want(c.urls.every((u) => /^wss?:\/\//.test(u)), `GATEWAY_URL=${raw('GATEWAY_URL')}: want ws:// or wss:// URLs, comma-separated`);
  want(c.secret !== '' || c.tokensFile !== '',
    'STILLTHERE_TOKEN_SECRET is missing: set it to the token secret of the load-test deployment ' +
    '(the gateway\'s STILLTHERE_TOKEN_SECRET), or pass TOKENS_FILE with tokens minted by go run ./loadtest/tokens');
  want(c.secret === '' || c.secret.length >= 32, 'STILLTHERE_TOKEN_SECRET: shorter than 32 bytes, the gateway would refuse it');
  want(c.clients > 0, 'CLIENTS: want at least 1');
  want(c.connsPerVU > 0, 'CONNS_PER_VU: want at least 1');
  want(c.pingEvery >= 200 && c.pingEvery < c.ttl,
    `PING_INTERVAL=${fmt(c.pingEvery)}: want at least 200ms (the gateway allows 5 frames a second) and below the session TTL`);
  want(c.ttl > 0, 'STILLTHERE_SESSION_TTL: want more than 0');
  c.vus = Math.ceil(c.clients / c.connsPerVU);
  return c;
}

export const usage = `Settings are environment variables (k6 run -e NAME=value, or exported).
Required: STILLTHERE_TOKEN_SECRET (the load-test gateway's token secret) or TOKENS_FILE.
See loadtest/README.md for every setting and its default.`;

// ---------------------------------------------------------------- tokens

// loadTokens reads TOKENS_FILE, one JWT a line; call it in the init context.
export function loadTokens(c) {
  if (c.tokensFile === '') return null;
  const lines = open(c.tokensFile).split('\n').map((l) => l.trim()).filter((l) => l !== '');
  want(lines.length >= c.clients, `TOKENS_FILE=${c.tokensFile}: ${lines.length} tokens for ${c.clients} clients; each client needs its own user`);
  return lines;
}

function b64url(s) {
  return encoding.b64encode(s, 'rawurl');
}

// signToken makes an HS256 JWT the gateway accepts: sub, exp, optional seg.
export function signToken(secret, uid, segment, ttlMS) {
  const now = Math.floor(Date.now() / 1000);
  const claims = { sub: uid, iat: now, exp: now + Math.ceil(ttlMS / 1000) };
  if (segment !== '') claims.seg = segment;
  const unsigned = b64url(JSON.stringify({ alg: 'HS256', typ: 'JWT' })) + '.' + b64url(JSON.stringify(claims));
  return unsigned + '.' + b64url(hmac('sha256', secret, unsigned, 'binary'));
}

// runID names this run's users, so that a rerun within a minute is not
// taken for the same silence (the listener dedups per user and minute) and
// no guide left in an inbox by an earlier run reaches this one.
export function runID() {
  const alphabet = 'abcdefghijklmnopqrstuvwxyz0123456789';
  let id = '';
  for (let i = 0; i < 6; i++) id += alphabet[Math.floor(Math.random() * alphabet.length)];
  return `lt-${id}-`;
}

// ---------------------------------------------------------------- metrics

export const metrics = {
  guideLatency: new Trend('guide_latency', true), // deadline to guide, silent clients
  renewalRTT: new Trend('renewal_rtt', true), // ping sent to pong received
  connectErrors: new Counter('connection_errors'), // failed connects, errors, closes we did not ask for
  guidesOnTime: new Counter('guides_on_time'), // silent clients guided within the bound
  guidesMissed: new Counter('guides_missed'), // silent clients not guided within the bound
  guidesUnexpected: new Counter('guides_unexpected'), // guides to clients that were still there
  guidesDuplicate: new Counter('guides_duplicate'), // second and later guides to one client
  guidesReceived: new Counter('guides_received'), // every guide frame
  renewalErrors: new Counter('renewal_errors'), // error frames answering a ping
};

// ---------------------------------------------------------------- client

let loggedErrors = 0;
// logError logs the first 20 problems of each VU and counts the rest.
export function logError(msg) {
  if (loggedErrors++ < 20) console.warn(msg);
  else if (loggedErrors === 21) console.warn('(further connection errors are only counted)');
}

// Client is one user on one connection at a time. The script decides when
// it connects, goes silent, drops and leaves; the client keeps the books.
export class Client {
  constructor(c, index, uid, tok) {
    this.c = c;
    this.index = index;
    this.uid = uid;
    this.token = tok;
    this.url = c.urls[index % c.urls.length];
    this.ws = null;
    this.pingTimer = null;
    this.timers = [];
    this.pending = []; // send times of pings not yet answered, oldest first
    this.grant = null; // {sent, ttl}: the last pong's grant; deadline = sent + ttl
    this.silent = false; // stopped pinging on purpose
    this.onGrant = null; // called once with the deadline after the last ping is answered
    this.guides = 0;
    this.closing = false;
    this.onOpen = null;
    this.onPong = null;
    this.onGuide = null; // null: any guide is unexpected
    this.onDrop = null; // a close or error we did not ask for; null counts a connection error
  }

  after(ms, fn) {
    const t = setTimeout(fn, Math.max(0, ms));
    this.timers.push(t);
    return t;
  }

  clearTimers() {
    for (const t of this.timers) clearTimeout(t);
    this.timers = [];
    this.stopPinging();
  }

  connect() {
    this.closing = false;
    this.pending = [];
    const ws = new WebSocket(this.url, null, {
      headers: { Authorization: `Bearer ${this.token}` },
      tags: { script_client: 'stillthere' },
    });
    this.ws = ws;
    let dropped = false;
    const drop = (why) => {
      if (dropped || this.closing || this.ws !== ws) return;
      dropped = true;
      this.stopPinging();
      if (this.onDrop) {
        this.onDrop(why);
        return;
      }
      logError(`client ${this.uid}: ${why}`);
      metrics.connectErrors.add(1);
    };
    ws.addEventListener('open', () => {
      if (this.onOpen) this.onOpen();
    });
    ws.addEventListener('message', (e) => this.receive(e.data));
    ws.addEventListener('error', (e) => drop(`connection error: ${e.error}`));
    ws.addEventListener('close', (e) => drop(`closed by the gateway (${e.code})`));
  }

  startPinging() {
    this.silent = false;
    this.ping();
    this.pingTimer = setInterval(() => this.ping(), this.c.pingEvery);
  }

  stopPinging() {
    if (this.pingTimer !== null) clearInterval(this.pingTimer);
    this.pingTimer = null;
  }

  ping() {
    if (this.ws === null || this.ws.readyState !== 1) return;
    this.pending.push(Date.now());
    this.ws.send('{"type":"ping"}');
  }

  // goSilent stops pinging; once the last ping is answered, onGrant gets
  // the session's deadline (no later than the real one).
  goSilent(onGrant) {
    this.stopPinging();
    this.silent = true;
    this.onGrant = onGrant;
    if (this.pending.length === 0) this.grantKnown();
  }

  grantKnown() {
    if (this.onGrant === null || this.grant === null) return;
    const f = this.onGrant;
    this.onGrant = null;
    f(this.grant.sent + this.grant.ttl);
  }

  receive(data) {
    let f;
    try {
      f = JSON.parse(data);
    } catch (e) {
      logError(`client ${this.uid}: gateway sent a frame that is not JSON`);
      return;
    }
    const now = Date.now();
    switch (f.type) {
      case 'pong': {
        const sent = this.pending.shift();
        if (sent === undefined) break;
        metrics.renewalRTT.add(now - sent);
        check(f, {
          'pong grants no more than the expected TTL': (p) => p.ttl_ms > 0 && p.ttl_ms <= this.c.ttl + this.c.jitter,
        });
        this.grant = { sent, ttl: f.ttl_ms };
        if (this.onPong) this.onPong();
        if (this.silent && this.pending.length === 0) this.grantKnown();
        break;
      }
      case 'guide':
        this.guides++;
        metrics.guidesReceived.add(1);
        this.ws.send(JSON.stringify({ type: 'ack', id: f.id }));
        if (this.onGuide) this.onGuide(f, now);
        else metrics.guidesUnexpected.add(1);
        break;
      case 'error':
        if (f.code === 'unavailable') this.pending.shift();
        metrics.renewalErrors.add(1);
        logError(`client ${this.uid}: error frame ${f.code}: ${f.message || ''}`);
        break;
      default:
        // The contract lets the gateway add frame types; ignore them.
    }
  }

  // close leaves: 1000 deletes the session, any other code keeps it.
  close(code, reason) {
    this.closing = true;
    this.clearTimers();
    if (this.ws !== null && this.ws.readyState <= 1) this.ws.close(code, reason);
  }
}

// clientIndexes lists the clients this VU plays: CONNS_PER_VU consecutive
// indexes, so that every client index in [0, CLIENTS) has one VU.
export function clientIndexes(c) {
  const vu = exec.vu.idInTest - 1;
  const out = [];
  for (let j = 0; j < c.connsPerVU; j++) {
    const i = vu * c.connsPerVU + j;
    if (i < c.clients) out.push(i);
  }
  return out;
}

// isSilent spreads the silent clients evenly over the indexes, so that
// they connect throughout the ramp rather than all first.
export function isSilent(i, fraction) {
  return Math.floor((i + 1) * fraction) > Math.floor(i * fraction);
}

export function silentCount(c, fraction) {
  return Math.floor(c.clients * fraction);
}

export function tokenFor(c, tokens, data, i) {
  if (tokens !== null) return { uid: `token #${i + 1}`, token: tokens[i] };
  const uid = `${data.prefix}${i}`;
  return { uid, token: signToken(c.secret, uid, c.segment, c.tokenTTL) };
}

export function fmt(ms) {
  return ms % 1000 === 0 ? `${ms / 1000}s` : `${ms}ms`;
}

// ---------------------------------------------------------------- silent and active clients

// guided reads the settings of smoke.js and sessions.js: clients connect
// over RAMP, hold for HOLD pinging, and a SILENT_FRACTION of them stops
// pinging at a random moment early enough that its guide, and a LINGER to
// catch a duplicate, fit before the end.
export function guided(def) {
  const c = common(def);
  c.silentFraction = envFraction('SILENT_FRACTION', def.silentFraction, 'share of clients that go silent');
  c.tail = c.ttl + c.jitter + c.guideBound + c.linger;
  c.hold = envDuration('HOLD', def.hold === undefined ? c.pingEvery + c.tail + 2000 : def.hold, 'how long all clients stay connected after the ramp');
  c.silent = silentCount(c, c.silentFraction);
  want(c.silent === 0 || c.hold >= c.pingEvery + c.tail,
    `HOLD=${fmt(c.hold)}: too short; a silent client needs PING_INTERVAL + TTL + jitter + GUIDE_BOUND + LINGER = ${fmt(c.pingEvery + c.tail)}`);
  return c;
}

export function guidedThresholds(c, maxConnErrors) {
  const t = {
    checks: ['rate==1'],
    guides_unexpected: ['count==0'], // a guide to a client still there, or before its deadline
    guides_duplicate: ['count==0'],
    guides_missed: ['count==0'],
    connection_errors: [`count<=${maxConnErrors}`],
    renewal_errors: [`count<=${maxConnErrors}`],
  };
  if (c.silent > 0 && maxConnErrors === 0) {
    t.guides_on_time = [`count==${c.silent}`]; // every silent client, whatever went wrong
    t.guide_latency = [`max<=${c.guideBound}`];
  }
  return t;
}

export function guidedOptions(c, thresholds) {
  return {
    scenarios: {
      clients: {
        executor: 'per-vu-iterations',
        vus: c.vus,
        iterations: 1,
        maxDuration: fmt(c.ramp + c.hold + 60000),
        gracefulStop: '30s',
      },
    },
    thresholds,
    summaryTrendStats: ['min', 'med', 'p(95)', 'p(99)', 'max'],
  };
}

export function setupData(c) {
  // Clients start their schedule from here; VUs are initialised by now.
  return { prefix: c.uidPrefix || runID(), t0: Date.now() + 1000 };
}

// playGuided runs this VU's clients of smoke.js or sessions.js.
export function playGuided(c, tokens, data) {
  const endAt = data.t0 + c.ramp + c.hold;
  for (const i of clientIndexes(c)) {
    const { uid, token } = tokenFor(c, tokens, data, i);
    const cl = new Client(c, i, uid, token);
    const silent = isSilent(i, c.silentFraction);
    const connectAt = data.t0 + (c.ramp * i) / c.clients;
    cl.onOpen = () => {
      cl.startPinging();
      cl.after(endAt - Date.now(), () => cl.close(1000, 'done'));
      if (!silent) return;
      const opened = Date.now();
      const latest = endAt - c.tail;
      cl.after(1 + Math.random() * Math.max(0, latest - opened), () => cl.goSilent((deadline) => expectGuide(c, cl, deadline)));
    };
    cl.after(connectAt - Date.now(), () => cl.connect());
  }
}

// expectGuide checks one silent client: exactly one guide, not before its
// deadline, within GUIDE_BOUND after it.
function expectGuide(c, cl, deadline) {
  let got = false;
  let timedOut = false;
  cl.onGuide = (f, now) => {
    if (got) {
      metrics.guidesDuplicate.add(1);
      logError(`client ${cl.uid}: a second guide (id ${f.id})`);
      return;
    }
    got = true;
    const late = now - deadline;
    if (late < 0) {
      metrics.guidesUnexpected.add(1);
      check(null, { 'no guide before the deadline': () => false });
      logError(`client ${cl.uid}: guide ${-late}ms before its deadline`);
      return;
    }
    metrics.guideLatency.add(late);
    if (late <= c.guideBound) {
      metrics.guidesOnTime.add(1);
      check(null, { 'silent client guided within the bound': () => true });
    } else {
      logError(`client ${cl.uid}: guide ${late}ms after its deadline, over GUIDE_BOUND`);
      if (!timedOut) missed();
    }
  };
  const missed = () => {
    timedOut = true;
    metrics.guidesMissed.add(1);
    check(null, { 'silent client guided within the bound': () => false });
  };
  cl.after(deadline + c.guideBound - Date.now(), () => {
    if (got || timedOut) return;
    logError(`client ${cl.uid}: no guide within ${fmt(c.guideBound)} of its deadline`);
    missed();
  });
}
