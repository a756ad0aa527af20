// The package's own copy of the wire contract, for `npm pack`: `prepack` copies the
// repository's proto/ (the single source of truth, beside client/js as ../../proto) into
// client/js/proto/, which package.json "files" ships; `postpack` removes that copy again, so
// the checkout holds exactly one proto/ (client/js/proto/ is git-ignored as well).
//
//     node scripts/proto-copy.mjs copy | remove
//
// Packing again from an unpacked tarball (no repository around it) keeps the copy it ships.

import { cpSync, existsSync, readdirSync, rmSync, statSync } from 'node:fs';
import path from 'node:path';

const pkg = path.resolve(import.meta.dirname, '..');
const source = path.resolve(pkg, '..', '..', 'proto');
const copy = path.join(pkg, 'proto');
const CONTRACT = path.join('retrybudget', 'v1', 'budget.proto');

const action = process.argv[2];
const inRepository = existsSync(path.join(source, CONTRACT));

if (action === 'copy') {
  if (inRepository) {
    rmSync(copy, { recursive: true, force: true });
    // Only the .proto files (proto/ also holds the C++ build's CMakeLists.txt).
    cpSync(source, copy, {
      recursive: true,
      dereference: true,
      filter: (from) => statSync(from).isDirectory() || from.endsWith('.proto'),
    });
  } else if (!existsSync(path.join(copy, CONTRACT))) {
    console.error(`proto-copy: neither ${path.join(source, CONTRACT)} nor ${path.join(copy, CONTRACT)} exists; the package would not work`);
    process.exit(1);
  }
  const files = [];
  const walk = (dir) => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      if (e.isDirectory()) walk(path.join(dir, e.name));
      else files.push(path.relative(pkg, path.join(dir, e.name)));
    }
  };
  walk(copy);
  console.error(`proto-copy: packing ${files.join(', ')}`);
} else if (action === 'remove') {
  // A copy only: never the one a tarball brought.
  if (inRepository) rmSync(copy, { recursive: true, force: true });
} else {
  console.error('usage: node scripts/proto-copy.mjs copy | remove');
  process.exit(2);
}
