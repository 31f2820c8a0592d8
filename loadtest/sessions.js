// sessions.js: ramp to CLIENTS connections over RAMP, hold them for HOLD
// with pings every PING_INTERVAL, while a SILENT_FRACTION of them goes
// silent at random moments. Same checks as smoke.js; the custom metrics
// guide_latency (deadline to guide), renewal_rtt (ping to pong) and
// connection_errors show how the deployment holds up.
//
//   k6 run -e STILLTHERE_TOKEN_SECRET=... -e CLIENTS=20000 -e HOLD=10m loadtest/sessions.js
//
// Settings and defaults: loadtest/README.md.

import * as lt from './client.js';

const c = lt.guided({ clients: 5000, connsPerVU: 50, ramp: 60000, hold: 300000, silentFraction: 0.1 });
c.maxConnErrors = lt.envInt('MAX_CONN_ERRORS', 0, 'connection errors tolerated before the run fails');
const tokens = lt.loadTokens(c);
lt.failOnProblems(lt.usage);

const thresholds = lt.guidedThresholds(c, c.maxConnErrors);
thresholds.renewal_rtt = [`p(99)<${lt.envDuration('RTT_P99', 1000, 'bound of the p99 ping-to-pong time')}`];
export const options = lt.guidedOptions(c, thresholds);

export function setup() {
  console.log(`sessions: ramp to ${c.clients} connections (${c.connsPerVU} per VU, ${c.silent} go silent) ` +
    `on ${c.urls.join(', ')} over ${lt.fmt(c.ramp)}, hold ${lt.fmt(c.hold)}, ping every ${lt.fmt(c.pingEvery)}, ` +
    `TTL ${lt.fmt(c.ttl)} + jitter ${lt.fmt(c.jitter)}, guide bound ${lt.fmt(c.guideBound)}`);
  return lt.setupData(c);
}

export default function (data) {
  lt.playGuided(c, tokens, data);
}
