// reconnect-storm.js: every client connects and pings, then at STORM_AT
// they all drop at once (close 4000, which keeps the session, as a network
// blip or a gateway restart would) and reconnect within RECONNECT_WITHIN,
// pinging again at once. No session may run out and no guide may go out:
// the run fails on any guide, and on any client whose first ping after the
// drop was sent past its session's deadline. The clients then keep pinging
// for a TTL and more, to catch a guide for a session that lapsed unseen.
//
// A close by the gateway itself (1001 when it restarts) is handled the
// same way, so the script also covers a real rolling restart: raise
// MAX_CONN_ERRORS for the connects refused while an instance is down.
//
//   k6 run -e STILLTHERE_TOKEN_SECRET=... loadtest/reconnect-storm.js
//
// Settings and defaults: loadtest/README.md.

import { check } from 'k6';
import { Counter, Trend } from 'k6/metrics';
import * as lt from './client.js';

const c = lt.common({ clients: 200, connsPerVU: 1, ramp: 10000 });
c.stormAt = lt.envDuration('STORM_AT', 2 * c.pingEvery, 'when, after the ramp, every client drops');
c.within = lt.envDuration('RECONNECT_WITHIN', 5000, 'clients reconnect at a random moment within this after the drop');
c.after = lt.envDuration('AFTER', c.ttl + c.jitter + c.guideBound, 'how long clients keep pinging after the storm');
c.maxConnErrors = lt.envInt('MAX_CONN_ERRORS', 0, 'failed connects tolerated before the run fails');
lt.want(c.pingEvery + c.within < c.ttl,
  `RECONNECT_WITHIN=${lt.fmt(c.within)}: with PING_INTERVAL it must stay below the session TTL, or sessions lapse by design`);
const tokens = lt.loadTokens(c);
lt.failOnProblems(lt.usage);

const reconnects = new Counter('reconnects'); // clients back with a renewed session
const lateRenewals = new Counter('renewals_past_deadline'); // first ping after the drop sent past the deadline
const reconnectTime = new Trend('reconnect_time', true); // drop to the first pong on the new connection
const gatewayCloses = new Counter('gateway_closes'); // connections the gateway ended

export const options = {
  scenarios: {
    clients: {
      executor: 'per-vu-iterations',
      vus: c.vus,
      iterations: 1,
      maxDuration: lt.fmt(c.ramp + c.stormAt + c.within + c.after + 60000),
      gracefulStop: '30s',
    },
  },
  thresholds: {
    checks: ['rate==1'],
    guides_received: ['count==0'],
    renewals_past_deadline: ['count==0'],
    reconnects: [`count>=${c.clients}`],
    connection_errors: [`count<=${c.maxConnErrors}`],
    renewal_errors: [`count<=${c.maxConnErrors}`],
  },
  summaryTrendStats: ['min', 'med', 'p(95)', 'p(99)', 'max'],
};

export function setup() {
  console.log(`reconnect-storm: ${c.clients} clients on ${c.urls.join(', ')}, ping every ${lt.fmt(c.pingEvery)}; ` +
    `all drop ${lt.fmt(c.stormAt)} after the ${lt.fmt(c.ramp)} ramp and reconnect within ${lt.fmt(c.within)}; ` +
    `then ${lt.fmt(c.after)} more (TTL ${lt.fmt(c.ttl)} + jitter ${lt.fmt(c.jitter)})`);
  return lt.setupData(c);
}

export default function (data) {
  const stormAt = data.t0 + c.ramp + c.stormAt;
  const endAt = stormAt + c.within + c.after;
  for (const i of lt.clientIndexes(c)) {
    const { uid, token } = lt.tokenFor(c, tokens, data, i);
    const cl = new lt.Client(c, i, uid, token);
    let open = false; // a connection is up
    let started = false; // the first connection came up and pinged
    let droppedAt = 0; // when it last lost its connection
    let deadline = 0; // its session's deadline then
    const lost = () => {
      open = false;
      droppedAt = Date.now();
      deadline = cl.grant === null ? 0 : cl.grant.sent + cl.grant.ttl;
    };
    const reconnectSoon = (delay) => {
      cl.after(delay, () => {
        if (Date.now() < endAt) cl.connect();
      });
    };
    cl.onDrop = (why) => {
      if (open) {
        // The gateway ended an established connection (1001 on restart).
        gatewayCloses.add(1);
        lost();
        reconnectSoon(Math.random() * c.within);
      } else {
        // A connect failed: try again shortly.
        lt.logError(`client ${uid}: ${why}`);
        lt.metrics.connectErrors.add(1);
        reconnectSoon(250 + Math.random() * 750);
      }
    };
    cl.onOpen = () => {
      open = true;
      cl.after(endAt - Date.now(), () => cl.close(1000, 'done'));
      if (!started) {
        // First connection: ping, and drop with everyone at the storm.
        started = true;
        cl.startPinging();
        cl.after(stormAt - Date.now(), () => {
          if (!open) return; // the gateway dropped it already; it is reconnecting
          lost();
          cl.close(4000, 'reconnect storm');
          reconnectSoon(Math.random() * c.within);
        });
        return;
      }
      const sent = Date.now();
      const ok = deadline > 0 && sent < deadline;
      check(null, { 'first ping after the drop renews the session in time': () => ok });
      if (!ok) {
        lateRenewals.add(1);
        console.warn(`client ${uid}: first ping after the drop ${sent - deadline}ms past the deadline`);
      }
      const dropped = droppedAt;
      cl.grant = null;
      cl.onPong = () => {
        cl.onPong = null;
        reconnectTime.add(Date.now() - dropped);
        reconnects.add(1);
      };
      cl.startPinging();
    };
    cl.after(data.t0 + (c.ramp * i) / c.clients - Date.now(), () => cl.connect());
  }
}
