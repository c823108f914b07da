'use strict'
/*
 * kafkajs's admin client round trip on one topic: describeCluster, createTopics (with a config,
 * waiting for leaders; again: already exists), fetchTopicMetadata, fetchTopicOffsets and
 * fetchTopicOffsetsByTimestamp over records with known timestamps, describeConfigs of the topic
 * and of a broker, alterConfigs, createPartitions, deleteTopicRecords and deleteTopics.
 */
const { ConfigResourceTypes } = require('kafkajs')
const { kafka, main, producer: newProducer, waitFor } = require('./common')

const TOPIC = 'kafkajs-admin'
const BASE_MS = Date.now() - 60000 // record i of partition 0 has timestamp BASE_MS + i s

function configValue(described, name) {
  const entry = described.resources[0].configEntries.find(e => e.configName === name)
  return entry && { value: entry.configValue, readOnly: entry.readOnly }
}

async function describeTopicConfig(admin) {
  return admin.describeConfigs({
    resources: [{ type: ConfigResourceTypes.TOPIC, name: TOPIC, configNames: ['retention.ms'] }],
    includeSynonyms: false,
  })
}

async function produceTimed(client) {
  const producer = newProducer(client)
  await producer.connect()
  try {
    const messages = [...Array(6).keys()].map(i => ({
      partition: 0,
      value: `p0-${i}`,
      timestamp: String(BASE_MS + i * 1000),
    }))
    messages.push({ partition: 1, value: 'p1-0', timestamp: String(BASE_MS) })
    await producer.send({ topic: TOPIC, acks: -1, messages })
  } finally {
    await producer.disconnect()
  }
}

function numeric(ids) {
  return ids.slice().sort((x, y) => x - y)
}

function byPartition(rows, pick) {
  return Object.fromEntries(rows.map(row => [row.partition, pick(row)]))
}

main(async () => {
  const client = kafka('kafkajs-admin')
  const admin = client.admin()
  await admin.connect()
  try {
    const result = {}
    const cluster = await admin.describeCluster()
    result.cluster = {
      brokers: numeric(cluster.brokers.map(b => b.nodeId)),
      controller: cluster.controller,
      clusterId: cluster.clusterId,
    }
    const topics = [
      {
        topic: TOPIC,
        numPartitions: 2,
        replicationFactor: 3,
        configEntries: [{ name: 'retention.ms', value: '86400000' }],
      },
    ]
    result.created = await admin.createTopics({ topics, waitForLeaders: true, timeout: 30000 })
    result.createdAgain = await admin.createTopics({ topics, waitForLeaders: true })
    const metadata = await admin.fetchTopicMetadata({ topics: [TOPIC] })
    result.metadata = metadata.topics[0].partitions
      .map(p => ({
        partition: p.partitionId,
        leader: p.leader,
        replicas: numeric(p.replicas),
        isr: numeric(p.isr),
      }))
      .sort((a, b) => a.partition - b.partition)

    await produceTimed(client)
    result.offsets = byPartition(await admin.fetchTopicOffsets(TOPIC), p => [p.low, p.high])
    const at = async ms =>
      byPartition(await admin.fetchTopicOffsetsByTimestamp(TOPIC, ms), p => p.offset)
    result.offsetsByTimestamp = {
      exact: await at(BASE_MS + 2000),
      between: await at(BASE_MS + 2500),
      after: await at(BASE_MS + 600000),
    }

    result.retention = { before: configValue(await describeTopicConfig(admin), 'retention.ms') }
    await admin.alterConfigs({
      resources: [
        {
          type: ConfigResourceTypes.TOPIC,
          name: TOPIC,
          configEntries: [{ name: 'retention.ms', value: '3600000' }],
        },
      ],
    })
    result.retention.after = configValue(await describeTopicConfig(admin), 'retention.ms')
    const broker = await admin.describeConfigs({
      resources: [{ type: ConfigResourceTypes.BROKER, name: String(result.cluster.brokers[0]) }],
    })
    result.brokerConfig = {
      name: broker.resources[0].resourceName,
      entries: broker.resources[0].configEntries.length,
      logRetentionMs: configValue(broker, 'log.retention.ms'),
      logRetentionHours: configValue(broker, 'log.retention.hours'),
    }

    await admin.createPartitions({ topicPartitions: [{ topic: TOPIC, count: 3 }], timeout: 30000 })
    const grown = await waitFor('3 partitions with leaders in kafkajs metadata', async () => {
      const topic = (await admin.fetchTopicMetadata({ topics: [TOPIC] })).topics[0]
      return topic.partitions.length === 3 && topic.partitions.every(p => p.leader >= 0) && topic
    })
    result.partitionsAfterCreate = numeric(grown.partitions.map(p => p.partitionId))

    await admin.deleteTopicRecords({ topic: TOPIC, partitions: [{ partition: 0, offset: '2' }] })
    result.offsetsAfterDeleteRecords = byPartition(await admin.fetchTopicOffsets(TOPIC), p => [
      p.low,
      p.high,
    ])

    await admin.deleteTopics({ topics: [TOPIC], timeout: 30000 })
    const gone = async () => !(await admin.listTopics()).includes(TOPIC)
    await waitFor('the topic gone from listTopics', gone)
    result.deleted = true
    return result
  } finally {
    await admin.disconnect()
  }
})
