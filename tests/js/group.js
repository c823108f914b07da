'use strict'
/*
 * An idempotent kafkajs producer (acks -1, gzip sendBatch) and a consumer group of kafkajs
 * members on a 4-partition topic: two members split the partitions, read every record and commit
 * as they go; after both leave, a third member resumes from the commits (with partition 0 paused
 * until the others are read, then resumed). Then the group admin calls: describeGroups while two
 * members run and once empty, listGroups, fetchOffsets, setOffsets (a fourth member resumes
 * from them), deleteGroups. Reports what each member read, (partition, offset, key, value), for
 * the test to compare with what raftlog stores.
 */
const { CompressionTypes } = require('kafkajs')
const { GROUP_TIMEOUTS, check, kafka, main, producer: newProducer, waitFor } = require('./common')

const TOPIC = 'kafkajs-group'
const GROUP = 'kafkajs-group-g'
const FIRST = 200 // records read by the first two members
const SECOND = 40 // records the third member resumes to

function batchOf(from, count) {
  return [...Array(count).keys()].map(i => ({ key: `k${from + i}`, value: `v${from + i}` }))
}

/** Send `count` keyed records in two gzip batches. */
async function produce(producer, from, count) {
  const half = Math.floor(count / 2)
  for (const [start, size] of [[from, half], [from + half, count - half]]) {
    const metadata = await producer.sendBatch({
      acks: -1,
      compression: CompressionTypes.GZIP,
      topicMessages: [{ topic: TOPIC, messages: batchOf(start, size) }],
    })
    for (const { partition, errorCode } of metadata) {
      check(errorCode === 0, `partition ${partition}: error ${errorCode}`)
    }
  }
}

/** A member that records what it reads and each assignment it joins with. */
function member(client, name) {
  const consumer = client.consumer({ groupId: GROUP, ...GROUP_TIMEOUTS })
  const state = { name, consumer, rows: [], assignment: null }
  consumer.on(consumer.events.GROUP_JOIN, ({ payload }) => {
    state.assignment = (payload.memberAssignment[TOPIC] || []).slice().sort((x, y) => x - y)
  })
  return state
}

/**
 * Connect, subscribe and start the member. run() sets up the member's group state before its
 * first await, so a pause() right after start() holds from the first fetch; a crash of run()
 * fails the script (an unhandled rejection exits non-zero).
 */
async function start(state) {
  await state.consumer.connect()
  await state.consumer.subscribe({ topics: [TOPIC], fromBeginning: true })
  state.consumer.run({
    eachMessage: async ({ partition, message }) => {
      const { offset, key, value } = message
      state.rows.push([partition, Number(offset), key.toString(), value.toString()])
    },
  })
}

function describeGroup(description) {
  return {
    state: description.state,
    protocolType: description.protocolType,
    protocol: description.protocol,
    members: description.members.length,
  }
}

async function committed(admin) {
  const [topic] = await admin.fetchOffsets({ groupId: GROUP, topics: [TOPIC] })
  return Object.fromEntries(topic.partitions.map(p => [p.partition, Number(p.offset)]))
}

/** The group, empty: listed and described; its offsets set, which a fourth member resumes from. */
async function groupAdmin(client, admin, ends) {
  const result = {}
  result.listed = (await admin.listGroups()).groups.filter(g => g.groupId === GROUP)
  result.empty = describeGroup((await admin.describeGroups([GROUP])).groups[0])
  const partitions = Object.keys(ends).map(p => ({
    partition: Number(p),
    offset: String(Number(p) + 1),
  }))
  await admin.setOffsets({ groupId: GROUP, topic: TOPIC, partitions })
  result.afterSet = await committed(admin)
  const d = member(client, 'd')
  await start(d)
  const left = partitions.reduce((sum, p) => sum + ends[p.partition] - Number(p.offset), 0)
  await waitFor(`${left} records read by d`, () => d.rows.length >= left, 30000)
  await d.consumer.disconnect()
  result.rows = d.rows
  result.deleted = await admin.deleteGroups([GROUP])
  result.listedAfterDelete = (await admin.listGroups()).groups.filter(g => g.groupId === GROUP)
  return result
}

main(async () => {
  const client = kafka('kafkajs-group')
  const admin = client.admin()
  await admin.connect()
  const producer = newProducer(client, { idempotent: true, maxInFlightRequests: 1 })
  await producer.connect()
  try {
    const result = {}
    result.created = await admin.createTopics({
      topics: [{ topic: TOPIC, numPartitions: 4, replicationFactor: 3 }],
      waitForLeaders: true,
      timeout: 30000,
    })

    const a = member(client, 'a')
    const b = member(client, 'b')
    await start(a)
    await start(b)
    await waitFor(
      'two members sharing the 4 partitions',
      () => a.assignment && b.assignment && a.assignment.length === 2 && b.assignment.length === 2,
      40000
    )
    result.stable = describeGroup((await admin.describeGroups([GROUP])).groups[0])
    result.assignments = { a: a.assignment, b: b.assignment }
    await produce(producer, 0, FIRST)
    const firstRead = () => a.rows.length + b.rows.length >= FIRST
    await waitFor(`${FIRST} records read by a and b`, firstRead, 30000)
    await a.consumer.disconnect() // commits what it read, leaves the group
    await b.consumer.disconnect()
    result.committedAfterTwo = await committed(admin)

    await produce(producer, FIRST, SECOND)
    const c = member(client, 'c')
    await start(c)
    c.consumer.pause([{ topic: TOPIC, partitions: [0] }])
    const ends = Object.fromEntries(
      (await admin.fetchTopicOffsets(TOPIC)).map(p => [p.partition, Number(p.offset)])
    )
    const newOn = p => ends[p] - result.committedAfterTwo[p]
    const unpaused = [1, 2, 3].reduce((sum, p) => sum + newOn(p), 0)
    const besidePaused = () => c.rows.length >= unpaused
    await waitFor(`${unpaused} records beside paused partition 0`, besidePaused, 30000)
    result.readWhilePaused = c.rows.length
    result.pausedRows = c.rows.filter(([partition]) => partition === 0).length
    result.paused = c.consumer.paused()
    c.consumer.resume([{ topic: TOPIC, partitions: [0] }])
    await waitFor(`${SECOND} records read by c`, () => c.rows.length >= SECOND, 30000)
    await c.consumer.disconnect()
    result.committedAfterThird = await committed(admin)
    result.ends = ends
    result.rows = { a: a.rows, b: b.rows, c: c.rows }
    result.admin = await groupAdmin(client, admin, ends)
    return result
  } finally {
    await producer.disconnect()
    await admin.disconnect()
  }
})
