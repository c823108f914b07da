'use strict'
/*
 * A transactional kafkajs producer: three transactions on a 2-partition topic, each writing to
 * both partitions and committing a group's offset on an input topic (sendOffsets); the first
 * and third commit, the second aborts. A read_committed consumer reads only the committed
 * records (and, seeking partition 0 back to 0, reads its committed ones again); a
 * read_uncommitted one reads the aborted ones too. Reports the offsets the group's commits show
 * after each transaction and what each reader read, (partition, offset, value).
 */
const { GROUP_TIMEOUTS, kafka, main, producer: newProducer, waitFor } = require('./common')

const INPUT = 'kafkajs-txn-in'
const OUTPUT = 'kafkajs-txn-out'
const GROUP = 'kafkajs-txn-g' // the consume-transform-produce group whose offsets commit
const PER_TXN = 6 // records per transaction, alternating partitions

async function transaction(producer, prefix, inputOffset, end) {
  const txn = await producer.transaction()
  await txn.send({
    topic: OUTPUT,
    messages: [...Array(PER_TXN).keys()].map(i => ({ partition: i % 2, value: `${prefix}${i}` })),
  })
  await txn.sendOffsets({
    consumerGroupId: GROUP,
    topics: [{ topic: INPUT, partitions: [{ partition: 0, offset: String(inputOffset) }] }],
  })
  await (end === 'commit' ? txn.commit() : txn.abort())
}

async function committedInput(admin) {
  const [topic] = await admin.fetchOffsets({ groupId: GROUP, topics: [INPUT] })
  return Number(topic.partitions[0].offset)
}

/** A reader in its own group; `rows` fill as it reads. */
async function reader(client, groupId, readUncommitted) {
  const consumer = client.consumer({ groupId, readUncommitted, ...GROUP_TIMEOUTS })
  const state = { consumer, rows: [] }
  await consumer.connect()
  await consumer.subscribe({ topics: [OUTPUT], fromBeginning: true })
  consumer.run({
    eachMessage: async ({ partition, message }) => {
      state.rows.push([partition, Number(message.offset), message.value.toString()])
    },
  })
  return state
}

main(async () => {
  const client = kafka('kafkajs-txn')
  const admin = client.admin()
  await admin.connect()
  const producer = newProducer(client, {
    transactionalId: 'kafkajs-txn-producer',
    idempotent: true,
    maxInFlightRequests: 1,
  })
  try {
    const result = {}
    await admin.createTopics({
      topics: [
        { topic: INPUT, numPartitions: 1, replicationFactor: 3 },
        { topic: OUTPUT, numPartitions: 2, replicationFactor: 3 },
      ],
      waitForLeaders: true,
      timeout: 30000,
    })
    await producer.connect()
    // A transaction's offsets show once its marker is written, after commit() returns (as in
    // Kafka: OffsetFetch below v7 answers the stable offsets), so each reading waits for a change.
    const changedFrom = async before => {
      let now = before
      await waitFor(`the group's offset to change from ${before}`, async () => {
        now = await committedInput(admin)
        return now !== before
      })
      return now
    }
    result.committedInput = {}
    await transaction(producer, 'c', 5, 'commit')
    result.committedInput.afterCommit = await changedFrom(-1)
    await transaction(producer, 'a', 7, 'abort')
    result.committedInput.afterAbort = await committedInput(admin)
    await transaction(producer, 'd', 10, 'commit')
    result.committedInput.afterSecondCommit = await changedFrom(result.committedInput.afterAbort)

    const committed = await reader(client, 'kafkajs-txn-committed', false)
    const uncommitted = await reader(client, 'kafkajs-txn-uncommitted', true)
    const all = 3 * PER_TXN
    await waitFor(`${all} records read uncommitted`, () => uncommitted.rows.length >= all, 30000)
    // the third transaction's records follow the aborted ones on both partitions: once they are
    // read, the reader has passed every aborted record
    const thirdRead = () => committed.rows.filter(([, , value]) => value.startsWith('d')).length
    await waitFor('the third transaction read committed', () => thirdRead() >= PER_TXN, 30000)
    result.firstRead = committed.rows.slice()
    const onPartition0 = result.firstRead.filter(([partition]) => partition === 0).length
    committed.consumer.seek({ topic: OUTPUT, partition: 0, offset: '0' })
    await waitFor(
      'partition 0 read again after seek',
      () => committed.rows.length >= result.firstRead.length + onPartition0,
      30000
    )
    result.readCommitted = committed.rows
    result.readUncommitted = uncommitted.rows
    result.ends = Object.fromEntries(
      (await admin.fetchTopicOffsets(OUTPUT)).map(p => [p.partition, Number(p.offset)])
    )
    await committed.consumer.disconnect()
    await uncommitted.consumer.disconnect()
    return result
  } finally {
    await producer.disconnect()
    await admin.disconnect()
  }
})
