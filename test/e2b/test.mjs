// The unmodified E2B JS SDK against `airlock serve --e2b-listen`: the
// control plane, envd (commands, pty, files) and a sandbox's ports. Run by
// test/e2e's TestE2BSDK:
//   E2B_API_URL=http://127.0.0.1:PORT E2B_SANDBOX_URL=http://127.0.0.1:PORT \
//   E2B_API_KEY=<tenant key> E2B_OTHER_KEY=<another tenant's key> RUN=<unique> node test.mjs
// Prints one line per check; the last stdout line is a JSON object the Go
// test checks through airlock's own API ({"kept": <sandbox id>, "audited":
// <sandbox id>}). Exits 1 on the first failure.
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import http from 'node:http'
import {
  Sandbox, SandboxNotFoundError, AuthenticationError, SandboxError, CommandExitError, TimeoutError,
  FileNotFoundError, NotFoundError, FilesystemEventType, TemplateError,
} from 'e2b'

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

// front is a request to the E2B listener with Host: host, as wildcard DNS
// (<port>-<id>.<domain>) would send it; no name is resolved.
function front(method, path, host, headers = {}, body) {
  const base = new URL(process.env.E2B_SANDBOX_URL)
  return new Promise((resolve, reject) => {
    const req = http.request({ host: base.hostname, port: base.port, method, path, headers: { ...headers, Host: host } }, (res) => {
      const chunks = []
      res.on('data', (c) => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString() }))
    })
    req.on('error', reject)
    req.end(body)
  })
}

// waiter is a promise kept once test(x) holds for an x given to add.
function waiter(test) {
  let done
  const p = new Promise((r) => (done = r))
  return { p, add: (x) => test(x) && done() }
}

// The calls of the audit comparison: TestE2BSDK makes the same through
// airlock's API and expects the same records.
async function audited(run) {
  const a = await Sandbox.create({ metadata: { suite: run + '-audit' }, timeoutMs: 300_000 })
  made.push(a.sandboxId)
  assert.equal((await a.commands.run('echo audit')).stdout, 'audit\n')
  await a.files.write('/workspace/audit.txt', 'x')
  assert.equal(await a.files.read('/workspace/audit.txt'), 'x')
  assert.equal((await a.files.list('/workspace')).filter((x) => x.name === 'audit.txt').length, 1)
  assert.equal((await a.files.getInfo('/workspace/audit.txt')).size, 1)
  assert.equal(await a.files.makeDir('/workspace/ad'), true)
  await a.files.rename('/workspace/audit.txt', '/workspace/ad/moved.txt')
  await a.files.remove('/workspace/ad/moved.txt')
  assert.equal(await a.kill(), true)
  ok('the audited calls')
  return a.sandboxId
}

// envd: commands, pty, files, URLs and a port, through the unmodified SDK.
async function envdChecks(run) {
  const e = await Sandbox.create({ metadata: { suite: run + '-envd' }, envs: { FOO: 'bar' }, timeoutMs: 600_000 })
  made.push(e.sandboxId)

  // commands.run: output as it comes, exit codes
  const outs = []
  const errs = []
  const r = await e.commands.run('echo $FOO; echo oops >&2; echo $USER; pwd', { onStdout: (d) => outs.push(d), onStderr: (d) => errs.push(d) })
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'bar\nuser\n/workspace\n')
  assert.equal(r.stderr, 'oops\n')
  assert.equal(outs.join(''), r.stdout)
  assert.equal(errs.join(''), 'oops\n')
  const x = await rejects(e.commands.run('echo partial; exit 3'), CommandExitError, 'exit 3')
  assert.equal(x.exitCode, 3)
  assert.equal(x.stdout, 'partial\n')
  assert.match(x.error, /exit status 3/)
  assert.equal((await e.commands.run('id -u; echo $HOME', { user: 'root' })).stdout, '0\n/root\n')
  assert.equal((await e.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
  ok('commands.run: onStdout, onStderr, exit codes, CommandExitError, user, cwd')

  // background, list, kill
  const bg = await e.commands.run('sleep 300', { background: true })
  assert.ok((await e.commands.list()).some((p) => p.pid === bg.pid), 'listed')
  assert.equal(await bg.kill(), true)
  assert.ok(!(await e.commands.list()).some((p) => p.pid === bg.pid), 'killed, still listed')
  assert.equal(await e.commands.kill(bg.pid), false)
  // stdin
  const cat = await e.commands.run('cat', { background: true, stdin: true })
  await e.commands.sendStdin(cat.pid, 'hi\n')
  await e.commands.closeStdin(cat.pid)
  assert.equal((await cat.wait()).stdout, 'hi\n')
  // a command outlives its client's disconnect; connect follows it
  const gate = `/tmp/gate-${run}`
  const slow = await e.commands.run(`while [ ! -e ${gate} ]; do sleep 0.05; done; echo done`, { background: true })
  await slow.disconnect()
  const again = await e.commands.connect(slow.pid)
  await e.files.write(gate, '')
  assert.equal((await again.wait()).stdout, 'done\n')
  ok('background, list, kill, sendStdin, closeStdin, disconnect and connect')

  // timeout: the command is killed at its deadline
  await rejects(e.commands.run('sleep 120', { timeoutMs: 1_500 }), TimeoutError, 'timeoutMs')
  // It may be listed a moment longer: follow it to its end.
  for (const p of (await e.commands.list()).filter((p) => p.args.join(' ').includes('sleep 120'))) {
    const ended = await e.commands.connect(p.pid).then((h) => h.wait()).then(() => 'exited 0', (err) => err)
    assert.ok(ended instanceof CommandExitError || ended instanceof NotFoundError, `after its timeout: ${ended}`)
  }
  assert.ok(!(await e.commands.list()).some((p) => p.args.join(' ').includes('sleep 120')), 'listed after its timeout')
  ok('commands.run timeoutMs kills')

  // pty: create, input, resize, kill
  let screen = ''
  const sized = waiter((s) => s.includes('24 80'))
  const resized = waiter((s) => s.includes('30 100'))
  const term = await e.pty.create({
    cols: 80, rows: 24, onData: (d) => {
      screen += Buffer.from(d).toString()
      sized.add(screen)
      resized.add(screen)
    },
  })
  await e.pty.sendInput(term.pid, new TextEncoder().encode('stty size\n'))
  await sized.p
  await e.pty.resize(term.pid, { cols: 100, rows: 30 })
  await e.pty.sendInput(term.pid, new TextEncoder().encode('stty size; exit\n'))
  await resized.p
  assert.equal((await term.wait()).exitCode, 0)
  const term2 = await e.pty.create({ cols: 80, rows: 24, onData: () => {} })
  assert.equal(await e.pty.kill(term2.pid), true)
  assert.ok(!(await e.commands.list()).some((p) => p.pid === term2.pid), 'a killed terminal listed')
  ok('pty: create, sendInput, resize, kill')

  // files
  const w = await e.files.write('/workspace/a/b.txt', 'hello')
  assert.deepEqual([w.name, w.path, w.type], ['b.txt', '/workspace/a/b.txt', 'file'])
  const multi = await e.files.write([{ path: 'rel.txt', data: 'x' }, { path: '/tmp/y', data: new Blob(['y']) }])
  assert.deepEqual(multi.map((m) => m.path), ['/home/user/rel.txt', '/tmp/y'])
  assert.equal(await e.files.read('/workspace/a/b.txt'), 'hello')
  assert.equal(Buffer.from(await e.files.read('/workspace/a/b.txt', { format: 'bytes' })).toString(), 'hello')
  assert.equal(await new Response(await e.files.read('/workspace/a/b.txt', { format: 'stream' })).text(), 'hello')
  await rejects(e.files.read('/workspace/nope'), FileNotFoundError, 'read a missing file')
  const listed = await e.files.list('/workspace', { depth: 2 })
  const byPath = Object.fromEntries(listed.map((x) => [x.path, x]))
  assert.equal(byPath['/workspace/a'].type, 'dir')
  assert.equal(byPath['/workspace/a/b.txt'].type, 'file')
  assert.equal(typeof byPath['/workspace/a/b.txt'].mode, 'number')
  assert.ok(byPath['/workspace/a/b.txt'].modifiedTime instanceof Date)
  assert.ok(!(await e.files.list('/workspace', { depth: 1 })).some((x) => x.path === '/workspace/a/b.txt'), 'depth 1 went deeper')
  assert.equal(await e.files.exists('/workspace/nope'), false)
  assert.equal(await e.files.exists('/workspace/a/b.txt'), true)
  assert.equal((await e.files.getInfo('/workspace/a/b.txt')).size, 5)
  assert.equal(await e.files.makeDir('/workspace/d'), true)
  assert.equal(await e.files.makeDir('/workspace/d'), false)
  assert.equal((await e.files.rename('/workspace/a/b.txt', '/workspace/c.txt')).path, '/workspace/c.txt')
  await e.files.remove('/workspace/c.txt')
  assert.equal(await e.files.exists('/workspace/c.txt'), false)
  ok('files: write one and many, read text, bytes and stream, list depth, exists, getInfo, makeDir, rename, remove')

  // a stream body (octet-stream), plain and gzip
  for (const gzip of [false, true]) {
    const body = new Blob(['streamed ' + gzip]).stream()
    await e.files.write('/tmp/s', body, { gzip })
    assert.equal(await e.files.read('/tmp/s', { gzip }), 'streamed ' + gzip)
  }
  // what envd 0.6.1 does not have, the SDK refuses itself
  await rejects(e.files.write('/tmp/m', 'y', { metadata: { a: 'b' } }), TemplateError, 'file metadata')
  await rejects(e.files.watchDir('/workspace', () => {}, { includeEntry: true }), TemplateError, 'includeEntry')
  assert.equal(await e.isRunning(), true)
  ok('files: stream bodies plain and gzip; metadata and includeEntry refused by the SDK (envd 0.6.1)')

  // watchDir, recursive, names relative to the watched directory
  const events = []
  const wrote = waiter((ev) => ev.name === 'd/n.txt' && ev.type === FilesystemEventType.WRITE)
  const watch = await e.files.watchDir('/workspace', (ev) => { events.push(ev); wrote.add(ev) }, { recursive: true })
  await e.files.write('/workspace/d/n.txt', '1')
  await wrote.p
  await watch.stop()
  assert.ok(events.some((ev) => ev.name === 'd/n.txt' && ev.type === FilesystemEventType.CREATE), JSON.stringify(events))
  ok('watchDir recursive')

  // 80 MiB, both ways
  const big = new Uint8Array(80 << 20)
  for (let i = 0; i < big.length; i += 4096) big[i] = (i >> 12) & 255
  await e.files.write('/tmp/big', big)
  const back = await e.files.read('/tmp/big', { format: 'bytes' })
  assert.equal(back.length, big.length)
  assert.equal(createHash('sha256').update(back).digest('hex'), createHash('sha256').update(big).digest('hex'))
  ok('an 80 MiB file written and read')

  // Signed URLs: they name their sandbox by host only (docs/e2b.md), so
  // they are fetched with Host: 49983-<id>.<domain>, as wildcard DNS gives.
  const envdHost = e.getHost(49983)
  const up = new URL(await e.uploadUrl('/workspace/up.txt'))
  const form = new FormData()
  form.append('file', new Blob(['uploaded']), 'up.txt')
  const req = new Request('http://x/', { method: 'POST', body: form })
  const body = Buffer.from(await req.arrayBuffer())
  const ct = req.headers.get('content-type')
  let res = await front('POST', up.pathname + up.search, envdHost, { 'Content-Type': ct }, body)
  assert.equal(res.status, 200, res.body)
  assert.equal(JSON.parse(res.body)[0].path, '/workspace/up.txt')
  const down = new URL(await e.downloadUrl('/workspace/up.txt', { useSignatureExpiration: 60 }))
  res = await front('GET', down.pathname + down.search, envdHost)
  assert.deepEqual([res.status, res.body], [200, 'uploaded'])
  const refused = await front('GET', '/health', 'localhost', { 'E2b-Sandbox-Id': 'ffffffffffff', 'X-Access-Token': 'airlock_envd_x' })
  assert.equal(refused.status, 502)
  const forged = new URL(down)
  forged.searchParams.set('path', '/etc/passwd')
  assert.deepEqual(await front('GET', forged.pathname + forged.search, envdHost), refused, 'a signature for another path')
  const tampered = new URL(down)
  tampered.searchParams.set('signature', 'v1_' + 'A'.repeat(43))
  assert.deepEqual(await front('GET', tampered.pathname + tampered.search, envdHost), refused, 'a forged signature')
  // Without its host nothing names the sandbox: the control plane has no /files.
  res = await front('GET', down.pathname + down.search, new URL(process.env.E2B_SANDBOX_URL).host)
  assert.equal(res.status, 404, res.body)
  ok('uploadUrl and downloadUrl with signatures; forged ones refused as a missing sandbox')

  // A server inside, reached at getHost(port) with the owner's key.
  const serving = waiter((s) => s.includes('Serving HTTP'))
  await e.files.write('/workspace/www/index.html', 'hello from inside')
  let served = ''
  const srv = await e.commands.run('python3 -m http.server 8000', {
    background: true, cwd: '/workspace/www', envs: { PYTHONUNBUFFERED: '1' },
    onStdout: (d) => serving.add((served += d)), onStderr: (d) => serving.add((served += d)),
  })
  await serving.p
  const key = process.env.E2B_API_KEY
  res = await front('GET', '/index.html', e.getHost(8000), { 'X-API-Key': key })
  assert.deepEqual([res.status, res.body], [200, 'hello from inside'])
  // Another tenant's key, no key, a port nothing listens on of a missing sandbox: one answer.
  const missingPort = await front('GET', '/index.html', e.getHost(8000).replace(e.sandboxId, 'ffffffffffff'), { 'X-API-Key': key })
  assert.equal(missingPort.status, 502)
  assert.deepEqual(await front('GET', '/index.html', e.getHost(8000), { 'X-API-Key': other }), missingPort, 'another tenant')
  assert.deepEqual(await front('GET', '/index.html', e.getHost(8000)), missingPort, 'no key')
  assert.equal(await srv.kill(), true)
  ok('getHost(8000) reaches python3 -m http.server; another tenant, no key: as a missing sandbox')

  assert.equal(await e.kill(), true)
  assert.equal(await e.isRunning(), false)
  ok('isRunning after kill')
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
  await rejects(s.commands.run('true'), SandboxError, 'a command while paused')
  const paused = await Sandbox.list({ query: { metadata: { suite: run }, state: ['paused'] } }).nextItems()
  assert.deepEqual(paused.map((x) => x.sandboxId), [s.sandboxId])
  const again = await Sandbox.connect(s.sandboxId, { timeoutMs: 300_000 })
  assert.equal(again.sandboxId, s.sandboxId)
  assert.equal((await s.getInfo()).state, 'running')
  assert.equal((await again.commands.run('echo back')).stdout, 'back\n')
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

  await envdChecks(run)
  const audit = await audited(run)

  // s is left running for the Go test to check through airlock's API.
  for (const id of made) if (id !== s.sandboxId) await Sandbox.kill(id)
  console.log(JSON.stringify({ kept: s.sandboxId, audited: audit }))
}

main().catch(async (e) => {
  console.error('FAIL', e?.stack ?? e)
  for (const id of made) await Sandbox.kill(id).catch(() => {})
  process.exit(1)
})
