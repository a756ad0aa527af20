// The JS client over TLS and mutual TLS (options.channelCredentials), with a PKI made at test
// time by the openssl CLI (a CA, a server certificate for 127.0.0.1, a client certificate), the
// server started with --tls_cert / --tls_key (and --tls_client_ca for mTLS).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { BudgetClient, grpc } from '../../client/js/src/index.js';
import { startServer, waitUntil, tempDir, getBudget } from './helpers.mjs';

const KEY = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];

function makePki() {
  const dir = tempDir('rb-js-pki-');
  const ssl = (...args) => execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });
  ssl('req', '-x509', ...KEY, '-days', '2', '-keyout', 'ca.key', '-out', 'ca.pem', '-subj', '/CN=ca',
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign');
  for (const [name, ext] of [['server', 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n'], ['client', 'extendedKeyUsage=clientAuth\n']]) {
    ssl('req', ...KEY, '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', `/CN=${name}`);
    writeFileSync(path.join(dir, `${name}.ext`), ext);
    ssl('x509', '-req', '-days', '2', '-in', `${name}.csr`, '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial', '-out', `${name}.pem`, '-extfile', `${name}.ext`);
  }
  const read = (f) => readFileSync(path.join(dir, f));
  return { dir, read };
}

test('TLS: a client trusting the CA gets leases; one that does not never does', async (t) => {
  const pki = makePki();
  const server = await startServer(t, '', [`--tls_cert=${pki.dir}/server.pem`, `--tls_key=${pki.dir}/server.key`]);
  const client = new BudgetClient({ target: server.target, refreshPeriodMs: 50, channelCredentials: grpc.credentials.createSsl(pki.read('ca.pem')) });
  const budget = client.tenant('t');
  await waitUntil(() => budget.stats().leaseActive, { what: 'a lease over TLS' });
  assert.ok(budget.tryAcquire());
  assert.equal(await client.close(), null);
  // Plaintext to a TLS server, or a CA it does not know: no lease, ever.
  const selfSigned = makePki();
  for (const credentials of [grpc.credentials.createInsecure(), grpc.credentials.createSsl(selfSigned.read('ca.pem'))]) {
    const rogue = new BudgetClient({ target: server.target, refreshPeriodMs: 50, syncTimeoutMs: 300, channelCredentials: credentials, logger: () => {} });
    const b = rogue.tenant('t');
    await waitUntil(() => rogue.lastSyncStatus() !== null, { what: 'a failed Sync' });
    assert.equal(b.stats().leaseActive, false);
    assert.equal(b.stats().tokensReceived, 0);
    await rogue.close();
  }
});

test('mutual TLS: the client certificate is required', async (t) => {
  const pki = makePki();
  const server = await startServer(t, '', [`--tls_cert=${pki.dir}/server.pem`, `--tls_key=${pki.dir}/server.key`, `--tls_client_ca=${pki.dir}/ca.pem`]);
  const client = new BudgetClient({ target: server.target, refreshPeriodMs: 50, channelCredentials: grpc.credentials.createSsl(pki.read('ca.pem'), pki.read('client.key'), pki.read('client.pem')) });
  const budget = client.tenant('t');
  await waitUntil(() => budget.stats().leaseActive, { what: 'a lease over mTLS' });
  assert.ok(budget.tryAcquire());
  assert.equal(await client.close(), null);
  const rogue = new BudgetClient({ target: server.target, refreshPeriodMs: 50, syncTimeoutMs: 300, channelCredentials: grpc.credentials.createSsl(pki.read('ca.pem')), logger: () => {} });
  const b = rogue.tenant('t');
  await waitUntil(() => rogue.lastSyncStatus() !== null, { what: 'a failed Sync' });
  assert.equal(b.stats().leaseActive, false);
  await rogue.close();
});
