// The client's TypeScript declarations compile, strict, and describe the
// module as an application uses it (types/usage.ts).
import { it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

it('the declarations type-check an application', () => {
  const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
  const project = fileURLToPath(new URL('types/tsconfig.json', import.meta.url));
  const run = spawnSync(process.execPath, [tsc, '-p', project], { encoding: 'utf8', timeout: 120_000 });
  assert.equal(run.status, 0, `tsc -p ${project}:\n${run.stdout}${run.stderr}`);
});
