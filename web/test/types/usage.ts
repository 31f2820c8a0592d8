// Compiled, never run, by types.test.js: the client's declarations
// describe the module as an application uses it.
import {
  StillThere,
  State,
  CloseCode,
  backoffDelay,
  closeAction,
  defaults,
  refreshDelay,
  tokenExpiry,
  type Guide,
  type Options,
  type StateChange,
} from '../../client/stillthere.js';

const options: Options = {
  url: new URL('wss://chat.example.com/v1/ws'),
  token: async ({ reason }) => `a token, asked for at ${reason}`,
  activityEvents: ['keydown', 'pointerdown'],
  storage: globalThis.localStorage,
  backoff: { initial: 250 },
  pongTimeout: 5_000,
};
const client = new StillThere(options);

client.on('guide', (e) => {
  const guide: Guide = e.detail;
  const end: number | null = guide.deadline;
  if (guide.final) console.log('closed', guide.text, guide.stage, end);
});
client.addEventListener('statechange', (e) => {
  const change: StateChange = e.detail;
  if (change.state === State.RECONNECTING && change.code === CloseCode.GOING_AWAY) {
    const wait: number | undefined = change.retryIn;
    console.log(wait);
  }
});
client.on('superseded', (e) => {
  const dropped: { id: string; stage: number; final: boolean; deadline: number } = e.detail;
  console.log('not shown', dropped.id, dropped.stage, dropped.final, dropped.deadline);
});
const off = client.on('pong', (e) => console.log(e.detail.ttlMs, e.detail.deadline));
client.on('error', (e) => console.log(e.detail.code, e.detail.message));
client.on('token', (e) => console.log(e.detail.expires));
off();

client.start();
client.activity();
const state: State = client.state;
const deadline: number | null = client.deadline;
console.log(state, deadline);
client.stop();

const action: 'now' | 'backoff' | 'token' | 'stop' | 'retry' = closeAction(4001);
const wait: number = backoffDelay(3, defaults.backoff, Math.random);
const exp: number | null = tokenExpiry('a.b.c');
const refresh: number = refreshDelay(3_600_000, defaults.refreshBefore);
console.log(action, wait, exp, refresh);

// @ts-expect-error: a token is a string or a function that gives one
new StillThere({ url: 'wss://chat.example.com/v1/ws', token: 42 });
// @ts-expect-error: the url is required
new StillThere({ token: 't' });
// @ts-expect-error: the client has no such event
client.on('guides', () => {});
// @ts-expect-error: a guide's id is a string
client.on('guide', (e) => e.detail.id.toFixed());
