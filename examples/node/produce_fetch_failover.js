'use strict'
/*
 * raftlog from Node.js (docs/api.md, "Calling raftlog from another language"): create a topic,
 * produce with acks=all, fetch the records back, and follow a leader change.
 *
 *   RAFTLOG_BOOTSTRAP=127.0.0.1:9092 node produce_fetch_failover.js [topic]
 *
 * One line per step on stdout. After the first round it prints `ready: ...` and waits for a
 * line on stdin (tests/dataplane/server/test_node_grpc_client.py kills the leader meanwhile;
 * by hand, press Enter after moving the leader). Then it produces to the leader it knows: a
 * broker that is no longer the leader answers NOT_LEADER_OR_FOLLOWER, a dead one does not
 * answer (gRPC's UNAVAILABLE); either way the client asks for Metadata again and goes on with
 * the new leader. At the end it fetches the partition from offset 0 and prints every record.
 * Exit 0 when every acknowledged record was read back once and in order; else 1.
 */
const readline = require('readline')
const { RaftlogClient } = require('./raftlog_client')
const { encodeBatch, decodeBatches } = require('./record_batch')

const RECORDS_PER_ROUND = 3
const FOLLOW_LEADER_TIMEOUT_MS = 30000 // an election takes broker.session.timeout.ms and more
const RETRY_BACKOFF_MS = 100
const STDIN_TIMEOUT_MS = 60000

function step(line) {
  process.stdout.write(`${line}\n`)
}

const pause = ms => new Promise(resolve => setTimeout(resolve, ms))

/** Metadata until the partition has a leader whose address the metadata names. */
async function findLeader(client, topic, partition) {
  const deadline = Date.now() + FOLLOW_LEADER_TIMEOUT_MS
  for (;;) {
    const { address } = await client.refreshMetadata([topic])
    const leader = client.leader(topic, partition)
    if (leader) {
      step(
        `metadata from ${address}: leader of ${topic}-${partition} is broker ` +
          `${leader.leaderId} (epoch ${leader.leaderEpoch}) at ${leader.address}`,
      )
      return leader
    }
    if (Date.now() > deadline) {
      throw new Error(`${topic}-${partition} had no leader for ${FOLLOW_LEADER_TIMEOUT_MS} ms`)
    }
    await pause(RETRY_BACKOFF_MS)
  }
}

/**
 * `action(leader)` on the partition's leader; on a retriable error (NOT_LEADER_OR_FOLLOWER, a
 * broker that does not answer, ...) ask for Metadata again and retry on the leader it names.
 */
async function onLeader(client, topic, partition, what, action) {
  const deadline = Date.now() + FOLLOW_LEADER_TIMEOUT_MS
  let leader = client.leader(topic, partition) || (await findLeader(client, topic, partition))
  for (;;) {
    try {
      return { leader, result: await action(leader) }
    } catch (error) {
      if (!error.retriable || Date.now() > deadline) {
        throw error
      }
      const hint = error.leaderHint === undefined ? '' : `, leader hint broker ${error.leaderHint}`
      step(`${what} on broker ${leader.leaderId} failed: ${error.describe()}${hint}`)
      await pause(RETRY_BACKOFF_MS)
      leader = await findLeader(client, topic, partition)
    }
  }
}

async function produceRound(client, topic, round) {
  const records = []
  for (let i = 0; i < RECORDS_PER_ROUND; i++) {
    const n = round * RECORDS_PER_ROUND + i
    records.push({ key: `key-${n}`, value: `value-${n}`, timestampMs: Date.now() })
  }
  const batch = encodeBatch(records)
  const { leader, result } = await onLeader(client, topic, 0, 'produce', l =>
    client.produce(l, topic, 0, batch),
  )
  const first = BigInt(result.base_offset)
  const last = first + BigInt(records.length - 1)
  step(
    `produced ${records.length} records with acks=all to broker ${leader.leaderId}: ` +
      `offsets ${first}-${last}`,
  )
  return records.map((r, i) => ({ offset: first + BigInt(i), key: r.key, value: r.value }))
}

/** Every record from offset 0 up to the high watermark, fetched from the leader. */
async function fetchAll(client, topic) {
  const records = []
  let offset = 0n
  let highWatermark = -1n
  let leaderId
  while (highWatermark < 0n || offset < highWatermark) {
    const { leader, result } = await onLeader(client, topic, 0, 'fetch', l =>
      client.fetch(l, topic, 0, offset),
    )
    leaderId = leader.leaderId
    highWatermark = BigInt(result.high_watermark)
    for (const record of decodeBatches(result.records)) {
      if (record.offset >= offset) {
        records.push({
          offset: record.offset,
          key: record.key.toString('utf8'),
          value: record.value.toString('utf8'),
        })
        offset = record.offset + 1n
      }
    }
  }
  const shown = records.map(r => `${r.offset}:${r.value}`).join(' ')
  step(`fetched ${records.length} records from broker ${leaderId}: ${shown}`)
  return records
}

/** The next line on stdin, or an error after `timeoutMs`. */
function nextLine(lines, timeoutMs) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('no line on stdin in time')), timeoutMs)
    lines.once('line', line => {
      clearTimeout(timer)
      resolve(line)
    })
    lines.once('close', () => reject(new Error('stdin closed')))
  })
}

function sameRecords(acknowledged, fetched) {
  const show = rs => JSON.stringify(rs.map(r => [String(r.offset), r.key, r.value]))
  if (show(acknowledged) !== show(fetched)) {
    throw new Error(`acknowledged ${show(acknowledged)} but fetched ${show(fetched)}`)
  }
}

async function main() {
  const bootstrap = (process.env.RAFTLOG_BOOTSTRAP || '').split(',').filter(Boolean)
  if (bootstrap.length === 0) {
    throw new Error('RAFTLOG_BOOTSTRAP names no broker (host:port of BROKER listeners, comma separated)')
  }
  const topic = process.argv[2] || 'node-grpc-example'
  const client = new RaftlogClient(bootstrap)
  const lines = readline.createInterface({ input: process.stdin })
  try {
    const { address, response } = await client.refreshMetadata([])
    const brokers = response.brokers.map(b => b.node_id).join(',')
    step(`connected to ${address}: cluster ${response.cluster_id}, brokers ${brokers}`)
    const { controller, result } = await client.createTopic(topic, 1, 3)
    step(
      `created topic ${topic} on controller ${controller}: ${result.num_partitions} partition, ` +
        `replication factor ${result.replication_factor}`,
    )
    await findLeader(client, topic, 0)
    const acknowledged = await produceRound(client, topic, 0)
    sameRecords(acknowledged, await fetchAll(client, topic))
    step(`ready: leader is broker ${client.leader(topic, 0).leaderId}; waiting for a line on stdin`)
    await nextLine(lines, STDIN_TIMEOUT_MS)
    acknowledged.push(...(await produceRound(client, topic, 1)))
    sameRecords(acknowledged, await fetchAll(client, topic))
    step(`done: ${acknowledged.length} acknowledged records read back once and in order`)
  } finally {
    lines.close()
    client.close()
  }
}

main().then(
  () => process.exit(0),
  error => {
    step(`failed: ${error.describe ? error.describe() : error.message}`)
    process.stderr.write(`${error.stack || error}\n`)
    process.exit(1)
  },
)
