// Type declarations of the stillthere client (stillthere.js). The wire
// contract it speaks is docs/protocol.md of the stillthere repository.

/** The client's states, in the order a connection goes through them. */
export type State = 'connecting' | 'open' | 'reconnecting' | 'closed';

export declare const State: Readonly<{
  CONNECTING: 'connecting';
  OPEN: 'open';
  RECONNECTING: 'reconnecting';
  CLOSED: 'closed';
}>;

/** Close codes of the contract. */
export declare const CloseCode: Readonly<{
  NORMAL: 1000;
  GOING_AWAY: 1001;
  POLICY_VIOLATION: 1008;
  TRY_AGAIN_LATER: 1013;
  INACTIVE: 4000;
  TOKEN_EXPIRED: 4001;
}>;

/** Why the client asks the application for a token. */
export interface TokenRequest {
  /**
   * connect: the first connect, or a reconnect while the token in hand is
   * about to expire (or after three attempts that never opened: a refused
   * upgrade looks like a dropped network to a browser);
   * refresh: the token expires within refreshBefore, and the connection
   * gets a fresh one in an auth frame, without reconnecting;
   * expired: the gateway closed with 4001.
   */
  reason: 'connect' | 'refresh' | 'expired';
}

/**
 * A token (HS256 JWT for the gateway's secret), or a callback that gives
 * one, maybe after a request to the application's own backend. Only with
 * a callback can the client refresh its token and recover from 4001.
 */
export type TokenSource = string | ((request: TokenRequest) => string | Promise<string>);

/** Where the client keeps the ids of the guides it has shown. */
export interface GuideStorage {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
}

export interface Backoff {
  /** The first reconnect's window, ms; each failed attempt doubles it. Default 500. */
  initial?: number;
  /** The largest window, ms. Default 30000. */
  max?: number;
}

export interface Options {
  /** The gateway's WebSocket URL, ws:// or wss://, e.g. wss://chat.example.com/v1/ws. */
  url: string | URL;
  /** The token, or a callback that gives a fresh one. */
  token: TokenSource;
  /**
   * DOM events that count as user activity, listened for on
   * activityTarget (capturing, passive). Default keydown, pointerdown,
   * pointermove, wheel and focus. Call activity() for any other.
   */
  activityEvents?: readonly string[];
  /**
   * Where activity is listened for. Default window in a browser, none
   * elsewhere; null listens nowhere (call activity() yourself).
   */
  activityTarget?: EventTarget | null;
  /**
   * The renewal interval, ms: at most one ping per interval, however
   * busy the user, counted from the gateway's answer to the last one, so
   * that the gateway sees them at least that far apart. 0 (the default)
   * takes a quarter of the TTL the gateway last granted, within 1 to
   * 30 s. At least 1000: the gateway answers pings closer together than
   * its renewal granularity (1 s) without renewing.
   */
  pingInterval?: number;
  /**
   * How long a ping waits for its answer (a pong, or an error frame that
   * it could not be answered), ms. Past it, the gateway is taken as gone
   * (frozen, or cut off without a close): the client drops the
   * connection as on a dropped network and reconnects on the backoff,
   * its first ping there telling the activity the unanswered one carried.
   * 0 (the default) takes the renewal interval, at least 2000: a busy
   * user is then on a new connection by about half the TTL after the
   * last answer, before the session runs out. At least 1000.
   */
  pongTimeout?: number;
  /**
   * How long before the token's exp to ask for a fresh one, ms: at a
   * random point between this and half of it, so that clients whose
   * tokens were minted together do not ask together; at most half the
   * time the token has left. Default 60000.
   */
  refreshBefore?: number;
  backoff?: Backoff;
  /** A connection open this long, ms, starts the backoff over when it ends. Default 5000. */
  stableAfter?: number;
  /**
   * Where the ids of shown guides are kept. Default sessionStorage: a
   * guide is shown once per tab, across reconnects and reloads (a tab
   * duplicated from this one starts with a copy). localStorage shows it
   * once per browser; null keeps the ids in memory only.
   */
  storage?: GuideStorage | null;
  /** The storage key. Default "stillthere.guides". */
  storageKey?: string;
  /** The WebSocket class. Default globalThis.WebSocket. */
  WebSocket?: new (url: string) => WebSocket;
  /** Random numbers in [0, 1) for the backoff's jitter, for tests. Default Math.random. */
  random?: () => number;
  /** The clock, Unix ms, for tests. Default Date.now. */
  now?: () => number;
}

export interface StateChange {
  state: State;
  previous: State;
  /** The close code that caused it, when a connection closed. */
  code?: number;
  /**
   * The gateway's close reason; on closed: "stopped" (stop()), "inactive"
   * (4000: the chat was closed), "token expired" (4001 without a token
   * callback); on reconnecting with code 1006, "no answer to ping" when
   * the client dropped a connection whose ping went unanswered for
   * pongTimeout.
   */
  reason?: string;
  /** On reconnecting: ms until the next attempt. */
  retryIn?: number;
}

export interface Guide {
  /** Stable for one silence and stage: the client shows each id once. */
  id: string;
  text: string;
  /** The stage of the silence, from 1. */
  stage: number;
  /**
   * A close stage: the chat is closed. Sent live, the gateway closes the
   * connection with 4000 right after; handed over from the inbox on
   * connect, it closes nothing: the user is back, and a new chat begins
   * with their activity.
   */
  final: boolean;
  /** When the session ran out, Unix ms (the gateway's clock), or null when the sender did not say. */
  deadline: number | null;
}

/**
 * A guide the client did not show: its silence began while, by the
 * client's record, the user was there, active while the client could not
 * reach the gateway (a dropped network). The gateway sent it before it
 * heard of that activity. Acked like any guide, never shown.
 */
export interface Superseded {
  id: string;
  /** The stage of the silence, from 1. */
  stage: number;
  /** A close stage: the client does not take the 4000 after it as the end of the chat, and reconnects. */
  final: boolean;
  /** When the session ran out, Unix ms (the gateway's clock). */
  deadline: number;
}

export interface Pong {
  /** The TTL granted, ms. */
  ttlMs: number;
  /** When the session runs out, Unix ms, counted from when the ping left. */
  deadline: number;
}

export interface TokenRefreshed {
  /** When the connection's token now expires, Unix ms. */
  expires: number;
}

export interface ClientError {
  /**
   * A gateway error code (unknown_type, bad_frame, unavailable, bad_token,
   * or a later one), or the client's own: token_failed (the callback threw
   * or gave no token), connect_failed (the WebSocket could not be made).
   */
  code: string;
  message: string;
}

export interface StillThereEventMap {
  statechange: CustomEvent<StateChange>;
  guide: CustomEvent<Guide>;
  superseded: CustomEvent<Superseded>;
  pong: CustomEvent<Pong>;
  token: CustomEvent<TokenRefreshed>;
  error: CustomEvent<ClientError>;
}

/** Defaults of the options. */
export declare const defaults: Readonly<{
  activityEvents: readonly string[];
  pingInterval: number;
  pongTimeout: number;
  refreshBefore: number;
  backoff: Readonly<Required<Backoff>>;
  stableAfter: number;
  storageKey: string;
}>;

/** A stillthere client for one user. */
export declare class StillThere extends EventTarget {
  /** @throws TypeError naming the option and its value, for a bad option. */
  constructor(options: Options);
  /** The client's state. */
  readonly state: State;
  /** When the session runs out by the last pong, Unix ms, or null before one. */
  readonly deadline: number | null;
  /** Connects; counts as activity (the user opened the chat). Again after closed: a new chat. */
  start(): void;
  /** Reports user activity the listeners do not see. */
  activity(): void;
  /**
   * The user leaves on purpose: closes with 1000, and no guide follows.
   * Without an open connection (while reconnecting) it connects once to
   * close with 1000, trying for up to 30 s; the promise settles when the
   * gateway was told, or it gave up.
   */
  stop(): Promise<void>;
  /** Listens for an event; returns the function that stops listening. */
  on<K extends keyof StillThereEventMap>(type: K, listener: (event: StillThereEventMap[K]) => void): () => void;
  addEventListener<K extends keyof StillThereEventMap>(
    type: K,
    listener: (event: StillThereEventMap[K]) => void,
    options?: boolean | AddEventListenerOptions,
  ): void;
  addEventListener(type: string, listener: EventListenerOrEventListenerObject | null, options?: boolean | AddEventListenerOptions): void;
  removeEventListener<K extends keyof StillThereEventMap>(
    type: K,
    listener: (event: StillThereEventMap[K]) => void,
    options?: boolean | EventListenerOptions,
  ): void;
  removeEventListener(type: string, listener: EventListenerOrEventListenerObject | null, options?: boolean | EventListenerOptions): void;
}

/** What the client does after a close with code. */
export declare function closeAction(code: number): 'now' | 'backoff' | 'token' | 'stop' | 'retry';

/** The wait before reconnect attempt step (from 0): uniform in [0, min(max, initial * 2^step)). */
export declare function backoffDelay(step: number, backoff: Required<Backoff>, random?: () => number): number;

/** When to ask for a fresh token, ms from now, for a token with left ms to live. */
export declare function refreshDelay(left: number, refreshBefore: number, random?: () => number): number;

/** The exp of a JWT, Unix ms, or null; the token is not verified. */
export declare function tokenExpiry(token: string): number | null;
