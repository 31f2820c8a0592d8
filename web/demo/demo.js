// The demo chat widget: the smallest page that shows what the client
// library does. Everything stillthere needs is in the StillThere client;
// this file only draws it. The token comes from the URL's fragment
// (#token=...), which the browser never sends to a server.
import { StillThere } from './stillthere.js';

const $ = (id) => document.getElementById(id);
const stateEl = $('state');
const remainingEl = $('remaining');
const activityEl = $('activity');
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

  client.on('pong', () => {
    pongs++;
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
    if (detail.deadline !== null) li.dataset.deadlineMs = String(detail.deadline);
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
    if (text === '') return;
    say('me', text);
    input.value = '';
    client.activity();
  });

  $('restart').addEventListener('click', () => {
    closedEl.hidden = true;
    input.disabled = false;
    $('send').disabled = false;
    say('system', 'New chat.');
    input.focus();
    client.start();
  });

  // The countdown redraws the screen; it sends nothing.
  setInterval(() => {
    showActivity();
    const deadline = client.deadline;
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
