// The unmodified E2B JS SDK against `airlock serve --e2b-listen`: the
// control plane (what works without envd). Run by test/e2e's TestE2BSDK:
//   E2B_API_URL=http://127.0.0.1:PORT E2B_SANDBOX_URL=http://127.0.0.1:PORT \
//   E2B_API_KEY=<tenant key> E2B_OTHER_KEY=<another tenant's key> RUN=<unique> node test.mjs
// Prints one line per check; the last stdout line is a JSON object the Go
// test checks through airlock's own API ({"kept": <sandbox id>}). Exits 1
// on the first failure.
import assert from 'node:assert/strict'
import { Sandbox, SandboxNotFoundError, AuthenticationError, SandboxError } from 'e2b'

const run = process.env.RUN
const other = process.env.E2B_OTHER_KEY
assert.ok(run && other && process.env.E2B_API_KEY, 'RUN, E2B_API_KEY and E2B_OTHER_KEY are needed')
const made = []

function ok(what) {
  console.log('ok', what)
}

async function rejects(p, cls, what, match) {
  try {
    await p
  } catch (e) {
    assert.ok(e instanceof cls, `${what}: ${e?.constructor?.name}: ${e?.message}, want ${cls.name}`)
    if (match) assert.match(e.message, match, what)
    return e
  }
  assert.fail(`${what}: no error, want ${cls.name}`)
}

async function main() {
  // create with envs, metadata, timeout; getInfo
  const t0 = Date.now()
  const s = await Sandbox.create({ metadata: { suite: run, n: '0' }, envs: { FOO: 'bar' }, timeoutMs: 600_000 })
  made.push(s.sandboxId)
  assert.match(s.sandboxId, /^[0-9a-f]{12}$/)
  let info = await s.getInfo()
  assert.equal(info.sandboxId, s.sandboxId)
  assert.equal(info.state, 'running')
  assert.equal(info.templateId, 'base')
  assert.deepEqual(info.metadata, { suite: run, n: '0' })
  assert.ok(info.sandboxDomain, 'a domain is always answered')
  assert.ok(Math.abs(info.endAt - info.startedAt - 600_000) < 5_000, `endAt ${info.endAt} startedAt ${info.startedAt}`)
  ok('create with envs, metadata and timeout; getInfo')

  // setTimeout
  await s.setTimeout(120_000)
  info = await s.getInfo()
  assert.ok(info.endAt.getTime() >= t0 + 110_000 && info.endAt.getTime() <= Date.now() + 125_000, `endAt ${info.endAt}`)
  ok('setTimeout')

  // list with a metadata filter, in pages
  for (const n of ['1', '2']) {
    const x = await Sandbox.create({ metadata: { suite: run, n }, timeoutMs: 300_000 })
    made.push(x.sandboxId)
  }
  const decoy = await Sandbox.create({ metadata: { suite: run + '-other' }, timeoutMs: 300_000 })
  made.push(decoy.sandboxId)
  const pager = Sandbox.list({ query: { metadata: { suite: run } }, limit: 2 })
  const listed = []
  let pages = 0
  while (pager.hasNext) {
    listed.push(...(await pager.nextItems()))
    pages++
  }
  assert.deepEqual(listed.map((x) => x.sandboxId), made.slice(0, 3))
  assert.equal(pages, 2)
  assert.deepEqual(listed.map((x) => x.metadata.n), ['0', '1', '2'])
  ok('list with a metadata filter and paging')

  // pause: true, then false (already paused); state filter; connect resumes
  assert.equal(await s.pause(), true)
  assert.equal(await s.pause(), false)
  assert.equal((await s.getInfo()).state, 'paused')
  const paused = await Sandbox.list({ query: { metadata: { suite: run }, state: ['paused'] } }).nextItems()
  assert.deepEqual(paused.map((x) => x.sandboxId), [s.sandboxId])
  const again = await Sandbox.connect(s.sandboxId, { timeoutMs: 300_000 })
  assert.equal(again.sandboxId, s.sandboxId)
  assert.equal((await s.getInfo()).state, 'running')
  ok('pause, pause again, connect resumes')

  // snapshot, and a sandbox made from it
  const snap = await s.createSnapshot({ name: 't' })
  assert.match(snap.snapshotId, /^snapshot:/)
  assert.deepEqual(snap.names, ['t'])
  const fromSnap = await Sandbox.create(snap.snapshotId, { metadata: { suite: run + '-snap' }, timeoutMs: 300_000 })
  made.push(fromSnap.sandboxId)
  assert.equal((await fromSnap.getInfo()).templateId, snap.snapshotId)
  const snaps = await Sandbox.listSnapshots({ sandboxId: s.sandboxId }).nextItems()
  assert.deepEqual(snaps.map((x) => x.snapshotId), [snap.snapshotId])
  assert.equal(await fromSnap.kill(), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
  ok('createSnapshot, create from it, listSnapshots, deleteSnapshot')

  // metrics
  const metrics = await s.getMetrics()
  assert.equal(metrics.length, 1)
  assert.ok(metrics[0].memUsed > 0 && metrics[0].memTotal >= metrics[0].memUsed && metrics[0].cpuCount >= 1, JSON.stringify(metrics))
  ok('getMetrics')

  // network: default-deny, named hosts allowed, the whole internet refused
  await rejects(Sandbox.create({ allowInternetAccess: true }), SandboxError, 'allowInternetAccess', /never allows the whole internet/)
  await rejects(Sandbox.create({ network: { allowOut: ['10.0.0.0/8'] } }), SandboxError, 'a range', /not address ranges/)
  const netted = await Sandbox.create({ network: { allowOut: ['pypi.org'], denyOut: ['0.0.0.0/0'] }, timeoutMs: 300_000 })
  made.push(netted.sandboxId)
  const ni = await netted.getInfo()
  assert.deepEqual(ni.network.allowOut, ['pypi.org'])
  assert.equal(ni.allowInternetAccess, false)
  assert.equal(await netted.kill(), true)
  ok('network fields on default-deny')

  // lifecycle.onTimeout 'pause': paused at its timeout, not ended; connect resumes it
  const lp = await Sandbox.create({ metadata: { suite: run + '-lifecycle' }, timeoutMs: 1_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
  made.push(lp.sandboxId)
  assert.deepEqual((await lp.getInfo()).lifecycle, { onTimeout: 'pause', autoResume: true })
  // The daemon's once-a-second tick pauses it; nothing to wait on but its state.
  let lpInfo
  for (const deadline = Date.now() + 30_000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 200))) {
    lpInfo = await lp.getInfo()
    if (lpInfo.state !== 'running') break
  }
  assert.equal(lpInfo.state, 'paused')
  assert.ok(lpInfo.endAt.getTime() > Date.now() + 23 * 3600_000, `kept until ${lpInfo.endAt}`)
  await Sandbox.connect(lp.sandboxId, { timeoutMs: 300_000 })
  assert.equal((await lp.getInfo()).state, 'running')
  assert.equal(await lp.kill(), true)
  ok('lifecycle onTimeout pause, connect resumes')

  // another tenant's key: exactly a missing sandbox
  await rejects(Sandbox.getInfo(s.sandboxId, { apiKey: other }), SandboxNotFoundError, 'another tenant getInfo')
  await rejects(Sandbox.getInfo('ffffffffffff', { apiKey: other }), SandboxNotFoundError, 'missing getInfo')
  await rejects(Sandbox.connect(s.sandboxId, { apiKey: other }), SandboxNotFoundError, 'another tenant connect')
  assert.equal(await Sandbox.kill(s.sandboxId, { apiKey: other }), false)
  assert.equal(await Sandbox.setTimeout(s.sandboxId, 1000, { apiKey: other }).then(() => 'done', (e) => e.constructor.name), 'SandboxNotFoundError')
  assert.equal((await Sandbox.list({ apiKey: other, query: { metadata: { suite: run } } }).nextItems()).length, 0)
  assert.equal((await s.getInfo()).state, 'running')
  // envd with a wrong access token, and for a missing sandbox: one answer
  const envd = async (id, token) => {
    const r = await fetch(new URL('/health', process.env.E2B_SANDBOX_URL), { headers: { 'E2b-Sandbox-Id': id, 'X-Access-Token': token } })
    return `${r.status} ${await r.text()}`
  }
  const wrong = await envd(s.sandboxId, 'airlock_envd_wrong')
  assert.equal(wrong, await envd('ffffffffffff', 'airlock_envd_wrong'))
  assert.match(wrong, /^502 /)
  ok('tenant isolation: another key, a wrong access token')

  // a wrong key
  await rejects(Sandbox.create({ apiKey: 'airlock_tenant_nope' }), AuthenticationError, 'wrong key')
  ok('wrong key')

  // kill: true; isRunning false; kill again false; connect not found
  const k = await Sandbox.create({ metadata: { suite: run + '-kill' }, timeoutMs: 300_000 })
  made.push(k.sandboxId)
  assert.equal(await k.kill(), true)
  assert.equal(await k.isRunning(), false)
  assert.equal(await Sandbox.kill(k.sandboxId), false)
  await rejects(Sandbox.connect(k.sandboxId), SandboxNotFoundError, 'connect after kill')
  ok('kill, isRunning after kill, kill again, connect after kill')

  // s is left running for the Go test to check through airlock's API.
  for (const id of made) if (id !== s.sandboxId) await Sandbox.kill(id)
  console.log(JSON.stringify({ kept: s.sandboxId }))
}

main().catch(async (e) => {
  console.error('FAIL', e?.stack ?? e)
  for (const id of made) await Sandbox.kill(id).catch(() => {})
  process.exit(1)
})
