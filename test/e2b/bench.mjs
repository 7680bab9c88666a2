// The E2B side of bench's BenchmarkE2BFront: the unmodified SDK against
// `airlock serve --e2b-listen`, timed. Run by bench/e2b_test.go:
//   E2B_API_URL=... E2B_SANDBOX_URL=... E2B_API_KEY=<tenant key> N=<runs> node bench.mjs
// Prints one JSON object: milliseconds per run of create → first command
// output, of commands.run('true'), of a small GET of a server inside
// through getHost(8000), MiB/s of 10 MiB files.write and files.read, and
// the sandbox it leaves running with that server (for the Go side to
// time the same through airlock's API).
import http from 'node:http'
import { Sandbox } from 'e2b'

const n = Number(process.env.N || 20)
const key = process.env.E2B_API_KEY
const base = new URL(process.env.E2B_SANDBOX_URL)

const ms = (t0) => Number(process.hrtime.bigint() - t0) / 1e6

// get is GET path with Host: host and the tenant's key, on a new connection.
function get(host, path) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: base.hostname, port: base.port, path, agent: false, headers: { Host: host, 'X-API-Key': key } }, (res) => {
      res.resume()
      res.on('end', () => (res.statusCode === 200 ? resolve() : reject(new Error(`GET ${path}: ${res.statusCode}`))))
    })
    req.on('error', reject)
    req.end()
  })
}

async function main() {
  const out = { createFirstOutput: [], run: [], get: [], writeMibs: [], readMibs: [] }
  for (let i = 0; i < n; i++) {
    const t0 = process.hrtime.bigint()
    const s = await Sandbox.create({ timeoutMs: 300_000 })
    let first
    await s.commands.run('echo hi', { onStdout: () => { first ??= ms(t0) } })
    out.createFirstOutput.push(first)
    await s.kill()
  }
  const s = await Sandbox.create({ timeoutMs: 1_800_000 })
  for (let i = 0; i < 5; i++) await s.commands.run('true')
  for (let i = 0; i < n * 5; i++) {
    const t0 = process.hrtime.bigint()
    await s.commands.run('true')
    out.run.push(ms(t0))
  }
  const blob = new Uint8Array(10 << 20).fill(7)
  for (let i = 0; i < 5; i++) {
    let t0 = process.hrtime.bigint()
    await s.files.write('/tmp/ten', blob)
    out.writeMibs.push(10 / (ms(t0) / 1000))
    t0 = process.hrtime.bigint()
    const back = await s.files.read('/tmp/ten', { format: 'bytes' })
    out.readMibs.push(10 / (ms(t0) / 1000))
    if (back.length !== blob.length) throw new Error(`read ${back.length} bytes`)
  }
  await s.files.write('/tmp/www/small', 'x'.repeat(100))
  let ready
  const serving = new Promise((r) => (ready = r))
  let said = ''
  await s.commands.run('python3 -m http.server 8000', {
    background: true, cwd: '/tmp/www', envs: { PYTHONUNBUFFERED: '1' }, timeoutMs: 0,
    onStdout: (d) => (said += d).includes('Serving HTTP') && ready(),
    onStderr: (d) => (said += d).includes('Serving HTTP') && ready(),
  })
  await serving
  const host = s.getHost(8000)
  for (let i = 0; i < 20; i++) await get(host, '/small')
  for (let i = 0; i < n * 15; i++) {
    const t0 = process.hrtime.bigint()
    await get(host, '/small')
    out.get.push(ms(t0))
  }
  out.sandbox = s.sandboxId
  console.log(JSON.stringify(out))
  process.exit(0) // the server's stream would keep node running; the server keeps running
}

main().catch((e) => {
  console.error('FAIL', e?.stack ?? e)
  process.exit(1)
})
