// Test helpers: a WebSocket that records what the client sends, a
// scripted one with no gateway behind it, a TCP proxy that freezes its
// connections, an event recorder, and waits that give up.
import { randomBytes } from 'node:crypto';
import net from 'node:net';

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

/**
 * A WebSocket class for the client's WebSocket option with no gateway
 * behind it, and no timers of its own (a test may mock them): each socket
 * opens on the next microtask, records the frames sent on it, and hands
 * each to answer(frame, socket), which may call socket.reply() with a
 * frame from the gateway, now or from a timer, or nothing at all (a
 * gateway that went silent). close() records its code and ends nothing
 * else: the close frame is lost, as on a frozen connection.
 */
export function scriptedSocket(answer) {
  const sockets = [];
  class ScriptedSocket {
    readyState = 0;
    onopen = null;
    onmessage = null;
    onclose = null;
    onerror = null;
    sent = [];
    closed = null;
    constructor(url) {
      this.url = new URL(url);
      sockets.push(this);
      queueMicrotask(() => {
        if (this.readyState !== 0) return;
        this.readyState = 1;
        this.onopen?.({});
      });
    }
    send(data) {
      const frame = JSON.parse(data);
      this.sent.push({ at: Date.now(), frame });
      answer(frame, this);
    }
    /** Hands the client a frame from the gateway, soon, if still open. */
    reply(frame) {
      queueMicrotask(() => {
        if (this.readyState === 1) this.onmessage?.({ data: JSON.stringify(frame) });
      });
    }
    close(code, reason) {
      this.closed = { at: Date.now(), code, reason };
      this.readyState = 2;
    }
  }
  return { ScriptedSocket, sockets };
}

/**
 * A TCP proxy to a gateway's WebSocket URL. freeze() freezes the
 * connections open now, as a gateway stopped by SIGSTOP or cut off by a
 * partition would be: nothing passes either way, and no close either,
 * while the TCP connection stays up. Connections made later pass.
 */
export function freezableProxy(wsURL) {
  const target = new URL(wsURL.replace(/^ws/, 'http'));
  const links = new Set();
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(target.port), target.hostname);
    const link = { client, upstream, frozen: false };
    links.add(link);
    const pass = (from, to) => from.on('data', (b) => {
      if (!link.frozen) to.write(b);
    });
    pass(client, upstream);
    pass(upstream, client);
    const end = () => {
      if (link.frozen) return; // a frozen peer tells nothing
      client.destroy();
      upstream.destroy();
      links.delete(link);
    };
    for (const s of [client, upstream]) s.on('error', end).on('close', end);
  });
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => {
      resolve({
        url: `ws://127.0.0.1:${server.address().port}${target.pathname}`,
        /** Freezes the connections open now; resolves to how many. */
        freeze() {
          for (const l of links) l.frozen = true;
          return links.size;
        },
        close() {
          for (const l of links) {
            l.client.destroy();
            l.upstream.destroy();
          }
          links.clear();
          server.close();
        },
      });
    });
  });
}
