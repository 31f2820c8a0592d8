// stillthere client: the browser side of the stillthere wire contract, v1
// (docs/protocol.md). A dependency-free ES module for browsers, and for
// Node 22 or later (Node 20 with --experimental-websocket).
//
// What every chat client of stillthere has to get right, done once:
//   - it connects with a token, in the `token` query parameter (a browser
//     cannot set headers on a WebSocket), and sends a fresh one in an auth
//     frame before it expires, when the application gives a token callback;
//   - it pings on user activity, at most once per renewal interval, and
//     never on a bare timer: an open tab with nobody at it is a silent user;
//   - it reconnects with exponential backoff and full jitter, and acts on
//     each close code of the contract, and when a ping goes unanswered
//     (a frozen gateway, a half-open connection) as on a dropped network;
//   - it shows each guide once per id, across reconnects and reloads
//     (sessionStorage), acks it, and hands the application an event;
//   - it shows no guide of a silence the network made: activity it
//     recorded while it could not reach the gateway, it tells the gateway
//     before the inbox is handed over, and it drops a guide whose silence
//     began while, by that record, the user was there;
//   - it tells its state (connecting, open, reconnecting, closed) as events.

/** The client's states, in the order a connection goes through them. */
export const State = Object.freeze({
  CONNECTING: 'connecting',
  OPEN: 'open',
  RECONNECTING: 'reconnecting',
  CLOSED: 'closed',
});

/** Close codes of the contract (docs/protocol.md, "Closing"). */
export const CloseCode = Object.freeze({
  NORMAL: 1000,
  GOING_AWAY: 1001,
  POLICY_VIOLATION: 1008,
  TRY_AGAIN_LATER: 1013,
  INACTIVE: 4000,
  TOKEN_EXPIRED: 4001,
});

/** Defaults of the options; see stillthere.d.ts for what each does. */
export const defaults = Object.freeze({
  activityEvents: Object.freeze(['keydown', 'pointerdown', 'pointermove', 'wheel', 'focus']),
  pingInterval: 0,
  pongTimeout: 0,
  refreshBefore: 60_000,
  backoff: Object.freeze({ initial: 500, max: 30_000 }),
  stableAfter: 5_000,
  storageKey: 'stillthere.guides',
});

// The least time between two pings: the gateway's default renewal
// granularity. A ping sooner than it after the last is answered from the
// last grant without renewing anything, so a later ping is the one that
// carries the activity.
const minPingInterval = 1_000;
// The most time between two pings of a busy user, whatever the TTL.
const maxPingInterval = 30_000;
// The least time a ping waits for its answer by default: a round trip
// over a slow mobile link, plus the gateway's renewal, fits in it with
// room to spare, so that a healthy connection is not dropped as silent.
const minPongTimeout = 2_000;
// The least pongTimeout an application may set.
const minPongTimeoutOption = 1_000;
// How many guide ids are remembered as shown. Ids are per silence and
// stage, so the last hundred cover any reconnect or reload.
const seenCap = 100;

/**
 * What to do after the gateway closed a connection with code.
 *   now:     reconnect at once (1001: the gateway is shutting down, and the
 *            session survives);
 *   backoff: the gateway asked to slow down (1008 over the rate limit,
 *            1013 no session store): reconnect after a wait that starts
 *            at the fourth step of the backoff;
 *   token:   get a fresh token, then reconnect at once (4001: the token
 *            expired);
 *   stop:    do not reconnect (4000: the chat was closed for inactivity);
 *   retry:   anything else (a dropped network, a refused upgrade): reconnect
 *            after the next step of the backoff.
 * @param {number} code
 * @returns {'now'|'backoff'|'token'|'stop'|'retry'}
 */
export function closeAction(code) {
  switch (code) {
    case CloseCode.GOING_AWAY:
      return 'now';
    case CloseCode.POLICY_VIOLATION:
    case CloseCode.TRY_AGAIN_LATER:
      return 'backoff';
    case CloseCode.TOKEN_EXPIRED:
      return 'token';
    case CloseCode.INACTIVE:
      return 'stop';
    default:
      return 'retry';
  }
}

/**
 * The wait before reconnect attempt `step` (from 0): exponential backoff
 * with full jitter, uniform in [0, min(max, initial * 2^step)). Full jitter
 * spreads the clients of a failed gateway over the whole window, so that
 * they do not come back in one herd.
 * @param {number} step
 * @param {{initial: number, max: number}} backoff
 * @param {() => number} [random]
 */
export function backoffDelay(step, backoff, random = Math.random) {
  const cap = Math.min(backoff.max, backoff.initial * 2 ** Math.min(step, 30));
  return Math.floor(random() * cap);
}

/**
 * When to ask for a fresh token, in ms from now, for a token with left ms
 * to live: at a random point between refreshBefore and half of it before
 * its expiry, or, for a token with less than twice refreshBefore left,
 * between a half and a quarter of what it has left. The spread keeps the
 * clients whose tokens were minted together from asking together.
 * @param {number} left
 * @param {number} refreshBefore
 * @param {() => number} [random]
 */
export function refreshDelay(left, refreshBefore, random = Math.random) {
  const lead = Math.min(refreshBefore, left / 2);
  return Math.max(0, Math.floor(left - lead + (random() * lead) / 2));
}

/**
 * The `exp` of a JWT, in Unix ms, or null when it does not say. The token
 * is not verified: the client only needs to know when to refresh it.
 * @param {string} token
 */
export function tokenExpiry(token) {
  try {
    const part = token.split('.')[1];
    const json = atob(part.replace(/-/g, '+').replace(/_/g, '/').padEnd(Math.ceil(part.length / 4) * 4, '='));
    const exp = JSON.parse(json).exp;
    return Number.isFinite(exp) ? exp * 1000 : null;
  } catch {
    return null;
  }
}

/**
 * A stillthere client for one user. Create it, listen for its events, and
 * call start() when the user opens the chat.
 */
export class StillThere extends EventTarget {
  #url;
  #tokenSource;
  #opts;
  #WebSocket;
  #random;
  #now;

  #state = State.CLOSED;
  #ws = null;
  #openedAt = 0;
  #step = 0; // backoff step of the next reconnect
  #reconnectTimer = null;
  #connecting = false; // a connect (token fetch, then the socket) is under way

  #token = null;
  #tokenExp = null;
  #pendingToken = null; // sent in an auth frame, not yet taken
  #refreshTimer = null;
  // Attempts in a row whose socket never opened. A browser sees a refused
  // upgrade (401) as a dropped network; every third such attempt asks the
  // callback for a fresh token, in case this one is why.
  #failedOpens = 0;
  // A connection opened once: the user may have a session to end.
  #everOpened = false;
  #freshNext = false;

  // Activity and pings. activityAt is the last activity (ms); a ping
  // carries the activityAt it was sent for, and renewedFor is that of the
  // last ping the gateway answered with a pong. Activity after renewedFor
  // is owed a ping, also across a reconnect.
  #activityAt = -Infinity;
  #renewedFor = -Infinity;
  #pingedFor = -Infinity; // the activity the last ping on this connection carried
  // When the last ping was answered (or sent, while it is not): the next
  // goes an interval after it. Counted from the answer, the gateway has
  // always taken the last ping before this one leaves, so that it sees
  // them at least the interval apart, however slow the way there.
  #lastPingAt = -Infinity;
  #unanswered = []; // pings without an answer yet, oldest first
  #pingTimer = null;
  #pongTimer = null; // runs while a ping waits for its answer
  #ttl = 0; // the last TTL granted, ms
  #deadline = null;

  // What the user's session would be had every ping got through: a run of
  // activity from the last pong on, each within a TTL of the one before,
  // keeps it alive until aliveUntil, the last of it at presentAt (both ms,
  // this clock). A gap of a full TTL ends the run: the user was silent
  // then, and a guide of that silence is theirs. skew is how far Redis's
  // clock, in which guides say their deadline, is ahead of this one, from
  // the last pong that said its deadline (0 until one did).
  #aliveUntil = -Infinity;
  #presentAt = -Infinity;
  #skew = 0;
  #sayPresence = false; // the next ping carries active_ago_ms
  // A close stage's guide was dropped as superseded: the 4000 after it
  // closed a chat the user is in, so the client reconnects.
  #supersededFinal = false;

  #storage; // where shown guide ids are kept, or null
  #seen = new Set();
  #listening = false;
  #onActivity = () => this.activity();
  #onOnline = () => this.#reconnectNow();

  /** @param {import('./stillthere.d.ts').Options} options */
  constructor(options) {
    super();
    if (options === null || typeof options !== 'object') {
      throw new TypeError(`stillthere: options: ${String(options)}, want an object`);
    }
    let url;
    try {
      url = new URL(String(options.url));
    } catch {
      throw new TypeError(`stillthere: url: ${JSON.stringify(String(options.url))}, want a ws:// or wss:// URL`);
    }
    if (url.protocol !== 'ws:' && url.protocol !== 'wss:') {
      throw new TypeError(`stillthere: url: ${JSON.stringify(url.href)}, want a ws:// or wss:// URL`);
    }
    this.#url = url;
    const tok = options.token;
    if (!(typeof tok === 'function' || (typeof tok === 'string' && tok !== ''))) {
      throw new TypeError(`stillthere: token: ${typeof tok === 'string' ? '""' : typeof tok}, want a token or a function that returns one`);
    }
    this.#tokenSource = tok;
    const backoff = { ...defaults.backoff, ...options.backoff };
    this.#opts = {
      activityEvents: options.activityEvents ?? defaults.activityEvents,
      activityTarget: options.activityTarget === undefined ? globalThis.window : options.activityTarget,
      pingInterval: options.pingInterval ?? defaults.pingInterval,
      pongTimeout: options.pongTimeout ?? defaults.pongTimeout,
      refreshBefore: options.refreshBefore ?? defaults.refreshBefore,
      backoff,
      stableAfter: options.stableAfter ?? defaults.stableAfter,
      storageKey: options.storageKey ?? defaults.storageKey,
    };
    for (const [name, v] of [
      ['pingInterval', this.#opts.pingInterval],
      ['pongTimeout', this.#opts.pongTimeout],
      ['refreshBefore', this.#opts.refreshBefore],
      ['backoff.initial', backoff.initial],
      ['backoff.max', backoff.max],
      ['stableAfter', this.#opts.stableAfter],
    ]) {
      if (typeof v !== 'number' || !(v >= 0) || !Number.isFinite(v)) {
        throw new TypeError(`stillthere: ${name}: ${String(v)}, want a number of ms, 0 or more`);
      }
    }
    if (this.#opts.pingInterval !== 0 && this.#opts.pingInterval < minPingInterval) {
      throw new TypeError(`stillthere: pingInterval: ${this.#opts.pingInterval}, want 0 (from the TTL) or at least ${minPingInterval} ms`);
    }
    if (this.#opts.pongTimeout !== 0 && this.#opts.pongTimeout < minPongTimeoutOption) {
      throw new TypeError(`stillthere: pongTimeout: ${this.#opts.pongTimeout}, want 0 (from the TTL) or at least ${minPongTimeoutOption} ms`);
    }
    if (backoff.initial === 0 || backoff.max < backoff.initial) {
      throw new TypeError(`stillthere: backoff: ${JSON.stringify(backoff)}, want 0 < initial <= max`);
    }
    if (!Array.isArray(this.#opts.activityEvents)) {
      throw new TypeError(`stillthere: activityEvents: ${String(this.#opts.activityEvents)}, want an array of event names`);
    }
    this.#WebSocket = options.WebSocket ?? globalThis.WebSocket;
    if (typeof this.#WebSocket !== 'function') {
      throw new TypeError('stillthere: WebSocket: none in this runtime, pass one in options.WebSocket');
    }
    this.#random = options.random ?? Math.random;
    this.#now = options.now ?? Date.now;
    this.#storage = options.storage === undefined ? sessionStorageOrNull() : options.storage;
    this.#loadSeen();
  }

  /** The client's state: connecting, open, reconnecting or closed. */
  get state() {
    return this.#state;
  }

  /** When the session runs out by the last pong (Unix ms), or null. */
  get deadline() {
    return this.#deadline;
  }

  /**
   * Connects, unless already started. The user opened the chat: that
   * counts as activity, so the first ping goes out once the socket opens.
   */
  start() {
    if (this.#state !== State.CLOSED) {
      this.activity();
      return;
    }
    this.#step = 0;
    this.#listen(true);
    // A new chat: nothing of the last one's run counts.
    this.#aliveUntil = -Infinity;
    this.#presentAt = -Infinity;
    this.#supersededFinal = false;
    this.#activityAt = this.#now();
    this.#setState(State.CONNECTING, {});
    this.#connect('connect');
  }

  /**
   * Reports user activity the listeners do not see (a message sent through
   * the application's own code, say). Pings at once, or at the end of the
   * renewal interval when one went out within it.
   */
  activity() {
    const now = this.#now();
    this.#activityAt = Math.max(this.#activityAt, now);
    if (now <= this.#aliveUntil) {
      // Within the run: the session would have been renewed now.
      this.#aliveUntil = Math.max(this.#aliveUntil, now + this.#ttl);
      this.#presentAt = Math.max(this.#presentAt, now);
    }
    this.#maybePing();
  }

  /**
   * The user leaves on purpose: closes with 1000, which ends the session
   * (unless they are connected on another device), so no guide follows.
   */
  stop() {
    if (this.#state === State.CLOSED) return Promise.resolve();
    const ws = this.#ws;
    const open = ws !== null && ws.readyState === 1;
    const token = this.#token;
    this.#shutdown(CloseCode.NORMAL, 'user left');
    this.#setState(State.CLOSED, { code: CloseCode.NORMAL, reason: 'stopped' });
    // No open connection to close (the client was reconnecting): the
    // session it had would run out and be guided. Tell the gateway on a
    // connection of its own.
    if (open || !this.#everOpened || token === null) return Promise.resolve();
    return this.#leave(token);
  }

  /**
   * Listens for one of the client's events; returns the function that
   * stops listening.
   */
  on(type, listener) {
    const fn = (e) => listener(e);
    this.addEventListener(type, fn);
    return () => this.removeEventListener(type, fn);
  }

  // --- connection ---

  // Connects with token only to close with 1000, so that the gateway ends
  // the session: tried until it works, for LEAVE_FOR at most.
  async #leave(token) {
    const until = this.#now() + LEAVE_FOR;
    for (let i = 0; this.#now() < until; i++) {
      if (await this.#leaveOnce(token)) return;
      await new Promise((resolve) => setTimeout(resolve, Math.min(2_000, 250 * 2 ** i)));
    }
  }

  #leaveOnce(token) {
    return new Promise((resolve) => {
      const url = new URL(this.#url);
      url.searchParams.set('token', token);
      let ws;
      try {
        ws = new this.#WebSocket(url.href);
      } catch {
        resolve(false);
        return;
      }
      const timer = setTimeout(() => {
        try {
          ws.close();
        } catch {
          // not open
        }
        resolve(false);
      }, 5_000);
      ws.onopen = () => {
        clearTimeout(timer);
        ws.close(CloseCode.NORMAL, 'user left');
        resolve(true);
      };
      ws.onerror = ws.onclose = () => {
        clearTimeout(timer);
        resolve(false);
      };
    });
  }

  async #connect(reason) {
    if (this.#connecting || this.#ws) return;
    this.#connecting = true;
    let token;
    try {
      token = await this.#currentToken(reason);
    } catch (err) {
      this.#connecting = false;
      if (this.#state === State.CLOSED) return;
      if (err instanceof TokenExpiredError) {
        this.#shutdown();
        this.#setState(State.CLOSED, { code: CloseCode.TOKEN_EXPIRED, reason: 'token expired' });
        return;
      }
      this.#emit('error', { code: 'token_failed', message: errorMessage(err) });
      this.#scheduleReconnect('retry', {});
      return;
    }
    this.#connecting = false;
    if (this.#state === State.CLOSED) return; // stopped meanwhile
    const url = new URL(this.#url);
    url.searchParams.set('token', token);
    // Activity of the run the gateway has not heard of (the network was
    // gone): the first frame is a ping that says so, and the gateway holds
    // the inbox until it has judged the guides by it. The activity is owed
    // a ping, which goes out as the socket opens.
    this.#sayPresence = this.#presentAt > this.#renewedFor;
    if (this.#sayPresence) url.searchParams.set('first', 'ping');
    let ws;
    try {
      ws = new this.#WebSocket(url.href);
    } catch (err) {
      this.#emit('error', { code: 'connect_failed', message: errorMessage(err) });
      this.#scheduleReconnect('retry', {});
      return;
    }
    this.#ws = ws;
    this.#openedAt = 0;
    this.#unanswered = [];
    this.#pingedFor = this.#renewedFor;
    this.#lastPingAt = -Infinity;
    ws.onopen = () => {
      if (this.#ws !== ws) return;
      this.#openedAt = this.#now();
      this.#everOpened = true;
      this.#failedOpens = 0;
      this.#setState(State.OPEN, {});
      this.#scheduleRefresh();
      this.#maybePing();
    };
    ws.onmessage = (e) => {
      if (this.#ws === ws) this.#onFrame(e.data);
    };
    ws.onclose = (e) => {
      if (this.#ws !== ws) return;
      this.#onClose(e.code, e.reason, this.#openedAt);
    };
    // A close event follows an error, with the code, in browsers; Node 20's
    // WebSocket sends none after a refused upgrade, so an error before the
    // socket opened ends the attempt as an abnormal close (1006). The
    // check on #ws keeps a close event that does follow from counting
    // twice.
    ws.onerror = () => {
      if (this.#ws !== ws || this.#openedAt) return;
      this.#onClose(1006, 'connection failed', 0);
    };
  }

  // The token to connect with: the one in hand while it has more than
  // refreshBefore to live (or when there is no callback), else a fresh one.
  async #currentToken(reason) {
    if (typeof this.#tokenSource === 'string') {
      this.#setToken(this.#tokenSource);
      // Past its exp and the gateway's leeway, a fixed token is refused
      // at every try: as after a 4001, only the application can help.
      if (this.#tokenExp !== null && this.#tokenExp + TOKEN_LEEWAY <= this.#now()) throw new TokenExpiredError();
      return this.#tokenSource;
    }
    if (reason !== 'expired' && !this.#freshNext && this.#token !== null) {
      const exp = this.#tokenExp;
      if (exp === null || exp - this.#now() > this.#opts.refreshBefore) return this.#token;
    }
    const token = await this.#fetchToken(reason);
    this.#freshNext = false;
    this.#setToken(token);
    return token;
  }

  async #fetchToken(reason) {
    const token = await this.#tokenSource({ reason });
    if (typeof token !== 'string' || token === '') {
      throw new TypeError(`the token callback returned ${typeof token === 'string' ? '""' : typeof token}, want a token`);
    }
    return token;
  }

  #setToken(token) {
    this.#token = token;
    this.#tokenExp = tokenExpiry(token);
  }

  #onClose(code, reason, openedAt) {
    this.#ws = null;
    this.#clearPing();
    this.#clearPongWait();
    clearTimeout(this.#refreshTimer);
    if (this.#state === State.CLOSED) return;
    this.#pendingToken = null;
    if (!openedAt) {
      this.#failedOpens++;
      if (this.#failedOpens % 3 === 0) this.#freshNext = true;
    } else if (this.#now() - openedAt >= this.#opts.stableAfter) {
      this.#step = 0; // it was a healthy connection: start the backoff over
    }
    let action = closeAction(code);
    if (action === 'stop' && this.#supersededFinal) {
      // The gateway closed a chat whose close stage this client dropped:
      // the user was there. Reconnect; the owed activity starts a session.
      this.#supersededFinal = false;
      action = 'retry';
    }
    const detail = { code, reason };
    if (action === 'stop') {
      this.#shutdown();
      this.#setState(State.CLOSED, { ...detail, reason: 'inactive' });
      return;
    }
    if (action === 'token' && typeof this.#tokenSource === 'string') {
      // Only the application can give a fresh token.
      this.#shutdown();
      this.#setState(State.CLOSED, { ...detail, reason: 'token expired' });
      return;
    }
    this.#scheduleReconnect(action, detail);
  }

  #scheduleReconnect(action, detail) {
    clearTimeout(this.#reconnectTimer);
    let delay;
    switch (action) {
      case 'now':
        // At once, spread over the first step's window, so that the
        // clients of a draining gateway do not arrive in one instant.
        this.#step = 0;
        delay = backoffDelay(0, this.#opts.backoff, this.#random);
        break;
      case 'token':
        // At once, spread like 1001: the tokens of clients that connected
        // together run out together.
        delay = backoffDelay(0, this.#opts.backoff, this.#random);
        break;
      case 'backoff':
        this.#step = Math.max(this.#step, 3);
      // falls through
      default:
        delay = backoffDelay(this.#step, this.#opts.backoff, this.#random);
        this.#step++;
    }
    this.#setState(State.RECONNECTING, { ...detail, retryIn: delay });
    const reason = action === 'token' ? 'expired' : 'connect';
    this.#reconnectTimer = setTimeout(() => {
      this.#reconnectTimer = null;
      this.#connect(reason);
    }, delay);
  }

  // The browser is back online: a wait for the network is over.
  #reconnectNow() {
    if (this.#state !== State.RECONNECTING || this.#reconnectTimer === null) return;
    clearTimeout(this.#reconnectTimer);
    this.#reconnectTimer = null;
    this.#connect('connect');
  }

  // Ends everything under way; with code, closes the socket with it.
  #shutdown(code, reason) {
    clearTimeout(this.#reconnectTimer);
    this.#reconnectTimer = null;
    clearTimeout(this.#refreshTimer);
    this.#clearPing();
    this.#clearPongWait();
    this.#listen(false);
    const ws = this.#ws;
    this.#ws = null;
    if (ws && code !== undefined) {
      try {
        ws.close(code, reason);
      } catch {
        // already closing
      }
    }
  }

  #setState(state, detail) {
    const previous = this.#state;
    if (previous === state && state !== State.RECONNECTING) return;
    this.#state = state;
    this.#emit('statechange', { state, previous, ...detail });
  }

  #listen(on) {
    const target = this.#opts.activityTarget;
    if (!target || typeof target.addEventListener !== 'function' || on === this.#listening) return;
    this.#listening = on;
    const opts = { capture: true, passive: true };
    for (const type of this.#opts.activityEvents) {
      if (on) target.addEventListener(type, this.#onActivity, opts);
      else target.removeEventListener(type, this.#onActivity, opts);
    }
    if (on) target.addEventListener('online', this.#onOnline);
    else target.removeEventListener('online', this.#onOnline);
  }

  // --- frames ---

  #send(frame) {
    const ws = this.#ws;
    if (!ws || ws.readyState !== 1) return false;
    ws.send(JSON.stringify(frame));
    return true;
  }

  #onFrame(data) {
    if (typeof data !== 'string') return;
    let f;
    try {
      f = JSON.parse(data);
    } catch {
      return;
    }
    if (f === null || typeof f !== 'object') return;
    // Later versions of the contract add frames and fields: what the
    // client does not know, it ignores.
    switch (f.type) {
      case 'pong':
        this.#onPong(f);
        break;
      case 'guide':
        this.#onGuide(f);
        break;
      case 'auth_ok':
        this.#onAuthOK(f);
        break;
      case 'error':
        this.#onError(f);
        break;
    }
  }

  // --- activity and pings ---

  // The renewal interval: pingInterval, or from the TTL last granted, a
  // quarter of it within [1 s, 30 s]. Pings at most once per interval keep
  // a busy user's session alive: the ping at an interval's end carries
  // the activity within it, and lands long before the deadline.
  #interval() {
    if (this.#opts.pingInterval > 0) return this.#opts.pingInterval;
    if (this.#ttl <= 0) return minPingInterval;
    return Math.min(maxPingInterval, Math.max(minPingInterval, Math.floor(this.#ttl / 4)));
  }

  #maybePing() {
    if (this.#state !== State.OPEN || this.#activityAt <= this.#pingedFor) return;
    // One ping at a time: its answer calls again.
    if (this.#unanswered.length > 0) return;
    const wait = this.#lastPingAt + this.#interval() - this.#now();
    if (wait <= 0) {
      this.#ping();
      return;
    }
    if (this.#pingTimer === null) {
      this.#pingTimer = setTimeout(() => {
        this.#pingTimer = null;
        this.#maybePing();
      }, wait);
    }
  }

  #ping() {
    this.#clearPing();
    const now = this.#now();
    const frame = { type: 'ping' };
    if (this.#sayPresence && Number.isFinite(this.#presentAt)) {
      frame.active_ago_ms = Math.max(0, Math.floor(now - this.#presentAt));
    }
    if (!this.#send(frame)) return;
    this.#sayPresence = false;
    this.#lastPingAt = now;
    this.#pingedFor = this.#activityAt;
    this.#unanswered.push({ activityAt: this.#activityAt, sentAt: now });
    const ws = this.#ws;
    clearTimeout(this.#pongTimer);
    this.#pongTimer = setTimeout(() => this.#noAnswer(ws), this.#pongTimeout());
  }

  #clearPing() {
    clearTimeout(this.#pingTimer);
    this.#pingTimer = null;
  }

  // How long a ping waits for its answer: pongTimeout, or the renewal
  // interval, at least minPongTimeout. The last answered ping, at t0,
  // gave the session a deadline of t0 + TTL; a busy user's next ping
  // leaves by t0 + interval, a quarter of the TTL. Waiting an interval for
  // its answer, the client is on a new connection by about t0 + TTL/2
  // (and a step of the backoff), before the deadline: a gateway that froze
  // never costs a present user their session. Under a TTL of 8 s the
  // floor is longer than the interval, and the margin before the
  // deadline shorter; should a reconnect miss it, the first ping on the
  // new connection tells the activity (active_ago_ms), and no guide of
  // that silence is shown.
  #pongTimeout() {
    if (this.#opts.pongTimeout > 0) return this.#opts.pongTimeout;
    return Math.max(minPongTimeout, this.#interval());
  }

  #clearPongWait() {
    clearTimeout(this.#pongTimer);
    this.#pongTimer = null;
  }

  // The oldest ping was answered (a pong, or an error that it could not
  // be): the gateway is there, however slow its session store.
  #takeAnswer() {
    this.#clearPongWait();
    return this.#unanswered.shift();
  }

  // A ping went unanswered for its timeout, on a socket that is still
  // open: the gateway froze (a pause, a stopped process), or the way to it
  // broke without a close (a partition, a half-open connection). Only
  // silence comes here: a gateway that cannot reach its session store
  // answers with an error (unavailable), which is an answer. The client
  // drops the connection as a network would, and takes the dropped
  // network's path: a reconnect on the backoff, where the activity the
  // ping carried is still owed (it was never answered) and goes in the
  // first ping, with first=ping and active_ago_ms.
  #noAnswer(ws) {
    this.#pongTimer = null;
    if (this.#ws !== ws) return;
    this.#onClose(1006, 'no answer to ping', this.#openedAt);
    try {
      // Without a code: a gateway that wakes up and reads a 1000 would
      // end the session the new connection keeps.
      ws.close();
    } catch {
      // already closing
    }
  }

  #onPong(f) {
    const ping = this.#takeAnswer();
    if (!ping || !Number.isFinite(f.ttl_ms)) return;
    this.#lastPingAt = this.#now();
    this.#renewedFor = Math.max(this.#renewedFor, ping.activityAt);
    this.#ttl = f.ttl_ms;
    // From when the ping left, not when the pong came: the deadline is
    // never later than the gateway's.
    this.#deadline = ping.sentAt + f.ttl_ms;
    // The run starts again from what the gateway now knows; activity since
    // the ping left, which it has not heard of, carries it on.
    this.#aliveUntil = this.#deadline;
    if (this.#activityAt > this.#renewedFor) {
      this.#aliveUntil = Math.max(this.#deadline, this.#activityAt + f.ttl_ms);
      this.#presentAt = this.#activityAt;
    }
    // The gateway's deadline is Redis's now plus the TTL when the ping
    // came: the difference is the clocks' apart, plus the uplink's delay.
    if (Number.isFinite(f.deadline_ms)) this.#skew = f.deadline_ms - this.#deadline;
    this.#emit('pong', { ttlMs: f.ttl_ms, deadline: this.#deadline });
    this.#maybePing(); // activity since it left is owed a ping
  }

  #onError(f) {
    const code = typeof f.code === 'string' ? f.code : 'unknown';
    const message = typeof f.message === 'string' ? f.message : '';
    if (code === 'unavailable') {
      // The session store missed this ping: the activity it carried is
      // owed again, at the end of the interval.
      this.#takeAnswer();
      this.#lastPingAt = this.#now();
      this.#pingedFor = this.#renewedFor;
      this.#maybePing();
    }
    if (code === 'bad_token') {
      this.#refreshFailed(code, message);
      return;
    }
    this.#emit('error', { code, message });
  }

  // --- guides ---

  #onGuide(f) {
    if (typeof f.id !== 'string' || f.id === '') return;
    // Every copy is acked: bookkeeping for the gateway, never a renewal.
    this.#send({ type: 'ack', id: f.id });
    // A close stage's guide sent live is followed by the 4000, and the
    // gateway takes nothing in between; one handed over from the inbox on
    // connect closes nothing: the user is back, and their pings count.
    const final = f.final === true;
    const deadline = Number.isFinite(f.deadline_ms) ? f.deadline_ms : null;
    if (this.#wasShown(f.id)) return;
    if (this.#superseded(deadline)) {
      // The silence began while the user was there, by this client's
      // record: it could not tell the gateway in time. Not shown.
      if (final) this.#supersededFinal = true;
      this.#emit('superseded', { id: f.id, stage: Number.isInteger(f.stage) && f.stage > 0 ? f.stage : 1, final, deadline });
      return;
    }
    this.#markShown(f.id);
    this.#emit('guide', {
      id: f.id,
      text: typeof f.text === 'string' ? f.text : '',
      stage: Number.isInteger(f.stage) && f.stage > 0 ? f.stage : 1,
      final,
      deadline,
    });
  }

  // Whether a guide of the silence that ran out at deadline (Redis's
  // clock) began while the user's run of activity kept them there. Only a
  // run past the last pong's deadline counts: up to it the gateway knew,
  // and a guide of that very deadline is one it sent knowing. A guide
  // that does not say its deadline is shown.
  #superseded(deadline) {
    if (deadline === null || this.#deadline === null || this.#aliveUntil <= this.#deadline) return false;
    return deadline < this.#aliveUntil + this.#skew;
  }

  #loadSeen() {
    if (!this.#storage) return;
    try {
      const ids = JSON.parse(this.#storage.getItem(this.#opts.storageKey) ?? '[]');
      if (Array.isArray(ids)) for (const id of ids) if (typeof id === 'string') this.#seen.add(id);
    } catch {
      // unreadable: start afresh
    }
  }

  #wasShown(id) {
    this.#loadSeen(); // another client on the same storage may have shown it
    return this.#seen.has(id);
  }

  #markShown(id) {
    this.#seen.delete(id);
    this.#seen.add(id);
    while (this.#seen.size > seenCap) this.#seen.delete(this.#seen.values().next().value);
    if (!this.#storage) return;
    try {
      this.#storage.setItem(this.#opts.storageKey, JSON.stringify([...this.#seen]));
    } catch {
      // full or refused: the ids stay in memory for this page
    }
  }

  // --- token refresh ---

  #scheduleRefresh() {
    clearTimeout(this.#refreshTimer);
    this.#refreshTimer = null;
    if (typeof this.#tokenSource !== 'function' || this.#tokenExp === null) return;
    this.#refreshAfter(refreshDelay(this.#tokenExp - this.#now(), this.#opts.refreshBefore, this.#random));
  }

  #refreshAfter(delay) {
    clearTimeout(this.#refreshTimer);
    // setTimeout fires at once past 2^31-1 ms (about 24.8 days): a longer
    // wait is taken in steps, each looking again whether it is time.
    const due = this.#now() + delay;
    const step = () => {
      const left = due - this.#now();
      if (left > MAX_TIMEOUT) {
        this.#refreshTimer = setTimeout(step, MAX_TIMEOUT);
        return;
      }
      this.#refreshTimer = setTimeout(() => {
        this.#refreshTimer = null;
        this.#refresh();
      }, Math.max(0, left));
    };
    step();
  }

  async #refresh() {
    if (this.#state !== State.OPEN) return; // the next connect fetches one
    let token;
    try {
      token = await this.#fetchToken('refresh');
    } catch (err) {
      this.#refreshFailed('token_failed', errorMessage(err));
      return;
    }
    // Not activity: the auth frame renews no session, and sends no ping.
    // The token is the connection's once the gateway took it (auth_ok).
    if (this.#send({ type: 'auth', token })) this.#pendingToken = token;
  }

  #onAuthOK(f) {
    if (this.#pendingToken !== null) {
      this.#setToken(this.#pendingToken);
      this.#pendingToken = null;
    }
    if (Number.isFinite(f.expires_ms)) this.#emit('token', { expires: f.expires_ms });
    this.#scheduleRefresh();
  }

  // A refresh failed or was refused: the connection keeps its token, and
  // the next try comes at half the time left (at least a second), so that
  // several fit before the gateway closes with 4001.
  #refreshFailed(code, message) {
    this.#pendingToken = null;
    this.#emit('error', { code, message });
    if (this.#state !== State.OPEN || typeof this.#tokenSource !== 'function') return;
    const left = (this.#tokenExp ?? this.#now()) - this.#now();
    this.#refreshAfter(Math.max(1_000, Math.min(30_000, left / 2)));
  }

  #emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }
}

// How long stop() keeps trying to tell the gateway the user left.
const LEAVE_FOR = 30_000;

// The gateway's leeway for clock skew past a token's exp.
const TOKEN_LEEWAY = 5_000;

// A fixed token past its exp: the client cannot connect with it.
class TokenExpiredError extends Error {
  constructor() {
    super('the token has expired');
  }
}

// The longest wait setTimeout takes as it is (2^31-1 ms).
const MAX_TIMEOUT = 2 ** 31 - 1;

function sessionStorageOrNull() {
  try {
    return globalThis.sessionStorage ?? null;
  } catch {
    return null; // a sandboxed frame throws on access
  }
}

function errorMessage(err) {
  return err instanceof Error ? err.message : String(err);
}
