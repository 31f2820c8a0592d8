// Test helpers: a WebSocket that records what the client sends, an event
// recorder, and waits that give up.
import { randomBytes } from 'node:crypto';

/** A unique user id: every silence of a user is guided once a minute. */
export function uid(name) {
  return `${name}-${randomBytes(4).toString('hex')}`;
}

/**
 * A WebSocket class for the client's WebSocket option: a real socket that
 * records the frames the client sends and those the gateway sends it, and
 * keeps every socket, so that a test can send behind the client's back,
 * or replay a frame to it. delayFirst holds each socket's first frame
 * back that many ms.
 */
export function spySocket({ delayFirst = 0 } = {}) {
  const sockets = [];
  const sent = [];
  const received = [];
  class SpySocket extends WebSocket {
    #onmessage = null;
    #sends = 0;
    constructor(url) {
      super(url);
      sockets.push(this);
    }
    send(data) {
      sent.push({ at: Date.now(), frame: JSON.parse(data) });
      // A slow uplink: the first frame reaches the gateway late.
      if (this.#sends++ === 0 && delayFirst > 0) setTimeout(() => super.send(data), delayFirst);
      else super.send(data);
    }
    set onmessage(fn) {
      this.#onmessage = fn;
      super.onmessage = (e) => {
        try {
          received.push({ at: Date.now(), frame: JSON.parse(e.data) });
        } catch {
          // Not JSON: the client's to judge, nothing to record.
        }
        fn?.(e);
      };
    }
    get onmessage() {
      return this.#onmessage;
    }
    /** Hands the client a frame as if the gateway had sent it. */
    replay(data) {
      this.#onmessage?.({ data });
    }
  }
  return {
    SpySocket,
    sockets,
    sent,
    received,
    frames: (type) => sent.filter((s) => s.frame.type === type),
    /** The frames of type the gateway sent, as they came off the socket. */
    receivedFrames: (type) => received.filter((r) => r.frame.type === type),
  };
}

/** A storage like sessionStorage, shared by the clients given it. */
export function memoryStorage() {
  const m = new Map();
  return {
    getItem: (k) => (m.has(k) ? m.get(k) : null),
    setItem: (k, v) => m.set(k, String(v)),
  };
}

/** Records the client's events, with when each came. */
export function record(client) {
  const events = [];
  for (const type of ['statechange', 'pong', 'guide', 'superseded', 'token', 'error']) {
    client.addEventListener(type, (e) => events.push({ type, at: Date.now(), ...e.detail }));
  }
  return {
    events,
    of: (type) => events.filter((e) => e.type === type),
    /** Resolves with the first event of type, already seen or coming, that pred accepts. */
    waitFor(type, pred = () => true, within = 15_000) {
      const seen = events.find((e) => e.type === type && pred(e));
      if (seen) return Promise.resolve(seen);
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => {
          client.removeEventListener(type, on);
          reject(new Error(`no ${type} event within ${within} ms; events: ${JSON.stringify(events)}`));
        }, within);
        const on = (e) => {
          const ev = { type, at: Date.now(), ...e.detail };
          if (!pred(ev)) return;
          clearTimeout(timer);
          client.removeEventListener(type, on);
          resolve(ev);
        };
        client.addEventListener(type, on);
      });
    },
  };
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Keeps client's user busy (activity every 300 ms) until promise settles,
 * so that no close stage ends the chat meanwhile; resolves with it.
 */
export async function busyUntil(client, promise) {
  let done = false;
  const settled = promise.finally(() => {
    done = true;
  });
  while (!done) {
    client.activity();
    await Promise.race([sleep(300), settled.catch(() => {})]);
  }
  return settled;
}
