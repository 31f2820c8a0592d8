// The demo chat widget: the smallest page that shows what the client
// library does. Everything stillthere needs is in the StillThere client;
// this file only draws it, and talks to the dev stack's demo bot (POST
// bot, beside this page), which passes the turn through the activity
// endpoint as a platform's servers would. The token comes from the URL's
// fragment (#token=...), which the browser never sends to a server but
// as a bearer: to the WebSocket, and to the bot, which serves only the
// holders of the stack's tokens.
import { StillThere } from './stillthere.js';

const $ = (id) => document.getElementById(id);
const stateEl = $('state');
const remainingEl = $('remaining');
const activityEl = $('activity');
const turnEl = $('turn');
const messages = $('messages');
const closedEl = $('closed');
const input = $('input');
const composer = $('composer');

const token = new URLSearchParams(location.hash.slice(1)).get('token');
if (!token) {
  stateEl.textContent = 'no token';
  stateEl.dataset.state = 'closed';
  say('system', 'No token: open this page at the URL that make run printed, which ends in #token=..., or add #token=<a JWT for this gateway> to this one.');
  input.disabled = true;
  $('send').disabled = true;
} else {
  run(token);
}

function run(token) {
  const url = new URL('/v1/ws', location.href);
  url.protocol = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const client = new StillThere({ url, token });

  let lastActivity = null;
  let pongs = 0;
  // The bot: whether it is thinking (our turn: the clock is held), when
  // its last answer came (this clock, ms), and the TTL of the last pong,
  // which a turn to the user grants as a ping does. botAway: the gateway
  // runs no bot, and the page is the plain presence demo.
  let thinking = false;
  let answeredAt = null;
  let ttl = 0;
  let botAway = false;
  // When the session ran out, by the last guide: the turn's TTL had a
  // jitter of its own, which the page learns only so.
  let ranOut = null;

  client.on('statechange', ({ detail }) => {
    stateEl.dataset.state = detail.state;
    let text = detail.state;
    if (detail.state === 'reconnecting') {
      text += ` in ${(detail.retryIn / 1000).toFixed(1)} s`;
      if (detail.code) text += ` (closed ${detail.code})`;
    }
    stateEl.textContent = text;
    if (detail.state === 'closed' && detail.reason === 'inactive') closeChat();
    if (detail.state === 'closed' && detail.reason === 'token expired') {
      say('system', 'The token expired. Open the page again with a fresh one.');
    }
  });

  client.on('pong', ({ detail }) => {
    pongs++;
    ttl = detail.ttlMs;
    ranOut = null;
    showActivity();
  });

  client.on('guide', ({ detail }) => {
    const received = Date.now();
    const li = say(detail.final ? 'guide final' : 'guide', detail.text);
    li.dataset.id = detail.id;
    li.dataset.stage = String(detail.stage);
    const meta = document.createElement('small');
    meta.textContent = `stage ${detail.stage}` + (detail.deadline !== null
      ? `, ${((received - detail.deadline) / 1000).toFixed(2)} s after the session ran out`
      : '');
    li.append(meta);
    if (detail.deadline !== null) {
      li.dataset.deadlineMs = String(detail.deadline);
      ranOut = detail.deadline;
    }
    // The frame after the one that draws it: when it is on screen.
    requestAnimationFrame(() => requestAnimationFrame(() => {
      li.dataset.shownMs = String(Date.now());
    }));
    if (detail.final) closeChat(detail.text);
  });

  client.on('error', ({ detail }) => {
    if (detail.code === 'unavailable') say('system', 'The session store was out of reach; the next ping retries.');
  });

  // What the user does, shown as activity. The client listens for the
  // same events itself: this only draws them.
  const noteActivity = (what) => {
    lastActivity = { what, at: Date.now() };
    showActivity();
  };
  input.addEventListener('keydown', () => noteActivity('typing'));
  document.addEventListener('pointerdown', () => noteActivity('click'), { capture: true });

  function showActivity() {
    if (lastActivity === null) return;
    const ago = ((Date.now() - lastActivity.at) / 1000).toFixed(1);
    activityEl.textContent = `${lastActivity.what} ${ago} s ago, ${pongs} ping${pongs === 1 ? '' : 's'} answered`;
  }

  composer.addEventListener('submit', (e) => {
    e.preventDefault();
    const text = input.value.trim();
    if (text === '' || thinking) return;
    say('me', text);
    input.value = '';
    client.activity();
    if (!botAway) ask(text);
  });

  // One message at a time: the bot answers it, then the turn is the
  // user's. It takes the turn (the user waits for us) before it thinks,
  // and passes it back when it answers: the answer is the response.
  async function ask(text) {
    thinking = true;
    $('send').disabled = true;
    const li = say('bot thinking', 'The bot is thinking...');
    const asked = Date.now();
    showTurn();
    let res;
    let body = {};
    try {
      res = await fetch(new URL('bot', location.href), {
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        body: JSON.stringify({ text }),
      });
      body = await res.json().catch(() => ({}));
    } catch (err) {
      res = { ok: false, status: 0 };
      body = { error: err.message };
    }
    thinking = false;
    $('send').disabled = input.disabled;
    if (res.status === 404 || res.status === 405) {
      botAway = true;
      li.remove();
      say('system', 'This gateway runs no demo bot (make run starts one): your messages stay on this page, and silence counts from your last key press.');
    } else if (!res.ok) {
      li.remove();
      say('system', `The bot did not answer: ${body.error ?? `HTTP ${res.status}`}.`);
    } else {
      answeredAt = Date.now();
      ranOut = null;
      li.className = 'bot';
      li.querySelector('p').textContent = body.text;
      li.dataset.answeredMs = String(answeredAt);
      li.dataset.askedMs = String(asked);
      const meta = document.createElement('small');
      meta.textContent = `the bot, after ${((answeredAt - asked) / 1000).toFixed(1)} s`;
      li.append(meta);
    }
    showTurn();
  }

  function showTurn() {
    if (thinking) {
      turnEl.dataset.turn = 'us';
      turnEl.textContent = 'ours: the bot is thinking, and no silence counts';
      return;
    }
    turnEl.dataset.turn = 'user';
    turnEl.textContent = answeredAt === null
      ? 'yours: write to the bot'
      : 'yours, since the bot answered';
  }

  $('restart').addEventListener('click', () => {
    closedEl.hidden = true;
    input.disabled = false;
    $('send').disabled = thinking;
    answeredAt = null;
    showTurn();
    say('system', 'New chat.');
    input.focus();
    client.start();
  });

  // The countdown redraws the screen; it sends nothing. While the bot
  // thinks the clock is held. From its answer the session runs a TTL (the
  // last pong's, within the jitter of the one the turn granted), or to the
  // last pong's deadline when the user pinged later; once a guide came,
  // to the deadline it names.
  setInterval(() => {
    showActivity();
    if (thinking) {
      remainingEl.textContent = 'held while the bot thinks';
      remainingEl.dataset.held = '';
      delete remainingEl.dataset.leftMs;
      return;
    }
    delete remainingEl.dataset.held;
    let deadline = client.deadline;
    if (answeredAt !== null && ttl > 0) deadline = Math.max(deadline ?? -Infinity, answeredAt + ttl);
    if (ranOut !== null) deadline = ranOut;
    if (deadline === null) return;
    const left = deadline - Date.now();
    remainingEl.textContent = left > 0
      ? `${(left / 1000).toFixed(1)} s left`
      : `ran out ${(-left / 1000).toFixed(1)} s ago`;
    remainingEl.dataset.leftMs = String(left);
  }, 100);

  function closeChat(text) {
    if (!closedEl.hidden) return;
    $('closed-text').textContent = text ?? 'This chat was closed for inactivity.';
    closedEl.hidden = false;
    input.disabled = true;
    $('send').disabled = true;
  }

  client.start();
  noteActivity('opened the chat');
  input.focus();
}

function say(kind, text) {
  const li = document.createElement('li');
  li.className = kind;
  const p = document.createElement('p');
  p.textContent = text;
  li.append(p);
  messages.append(li);
  li.scrollIntoView({ block: 'end' });
  return li;
}
