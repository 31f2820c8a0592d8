// smoke.js: a few hundred clients connect with tokens and ping; a fraction
// goes silent. Each silent client must get exactly one guide, no earlier
// than its deadline and within GUIDE_BOUND after it; active clients must
// get none. A failed check makes k6 exit non-zero.
//
//   k6 run -e STILLTHERE_TOKEN_SECRET=... -e GATEWAY_URL=ws://127.0.0.1:8080/v1/ws loadtest/smoke.js
//
// Settings and defaults: loadtest/README.md.

import * as lt from './client.js';

const c = lt.guided({ clients: 200, connsPerVU: 1, ramp: 10000, silentFraction: 0.25 });
const tokens = lt.loadTokens(c);
lt.failOnProblems(lt.usage);

export const options = lt.guidedOptions(c, lt.guidedThresholds(c, 0));

export function setup() {
  console.log(`smoke: ${c.clients} clients (${c.silent} go silent) on ${c.urls.join(', ')}, ` +
    `ramp ${lt.fmt(c.ramp)}, hold ${lt.fmt(c.hold)}, ping every ${lt.fmt(c.pingEvery)}, ` +
    `TTL ${lt.fmt(c.ttl)} + jitter ${lt.fmt(c.jitter)}, guide bound ${lt.fmt(c.guideBound)}`);
  return lt.setupData(c);
}

export default function (data) {
  lt.playGuided(c, tokens, data);
}
