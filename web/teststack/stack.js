// Starts the test stack (the Go command beside this file) for one test
// file, and stops it after. The binary is $STILLTHERE_TESTSTACK when set
// (web/test.sh builds it once), else `go run ./web/teststack`. The stack
// stops by itself when this process goes: its standard input is our pipe.
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../..', import.meta.url));

/**
 * Starts a stack; flags are teststack's (e.g. {ttl: '2s'}). Resolves once
 * it listens, with where everything is and helpers that use it.
 */
export async function startStack(flags = {}, { within = 180_000 } = {}) {
  const args = Object.entries(flags).map(([k, v]) => `-${k}=${v}`);
  const [cmd, argv] = process.env.STILLTHERE_TESTSTACK
    ? [process.env.STILLTHERE_TESTSTACK, args]
    : ['go', ['run', './web/teststack', ...args]];
  const child = spawn(cmd, argv, { cwd: root, stdio: ['pipe', 'pipe', 'pipe'] });
  // The stack's log, kept for a failure's report.
  const log = [];
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (s) => {
    log.push(s);
    if (log.length > 400) log.shift();
    if (process.env.STILLTHERE_TESTSTACK_LOG) process.stderr.write(s);
  });
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));

  const info = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`the test stack did not start within ${within} ms:\n${log.join('')}`)), within);
    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (s) => {
      out += s;
      const nl = out.indexOf('\n');
      if (nl < 0) return;
      clearTimeout(timer);
      try {
        resolve(JSON.parse(out.slice(0, nl)));
      } catch (err) {
        reject(new Error(`the test stack printed ${JSON.stringify(out.slice(0, nl))}: ${err.message}`));
      }
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`the test stack exited (${code ?? signal}) before it listened:\n${log.join('')}`));
    });
  });

  return {
    ...info,
    log: () => log.join(''),

    /** A token for user sub (segment seg), living ttl (a Go duration). */
    async token(sub, { seg = '', ttl = '1h' } = {}) {
      const q = new URLSearchParams({ sub, ttl });
      if (seg) q.set('seg', seg);
      const res = await fetch(`${info.control}/token?${q}`);
      const body = await res.text();
      if (!res.ok) throw new Error(`token for ${sub}: ${res.status} ${body}`);
      return body;
    },

    /** Restarts the second gateway: its clients are told 1001. */
    async restart() {
      const res = await fetch(`${info.control}/restart`, { method: 'POST' });
      if (!res.ok) throw new Error(`restart: ${res.status} ${await res.text()}`);
      return res.json();
    },

    /** Pushes a guide through the push endpoint; resolves with its status. */
    async pushGuide(guide) {
      const res = await fetch(info.push, {
        method: 'POST',
        headers: { authorization: `Bearer ${info.pushSecret}`, 'content-type': 'application/json', 'idempotency-key': guide.id },
        body: JSON.stringify(guide),
      });
      const body = await res.json();
      if (!res.ok) throw new Error(`push ${guide.id}: ${res.status} ${JSON.stringify(body)}`);
      return body.status;
    },

    /** Stops the stack and waits for it, 15 s at most. */
    async stop() {
      child.stdin.end();
      const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
      const end = await exited;
      clearTimeout(timer);
      return end;
    },
  };
}
