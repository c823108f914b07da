'use strict'
/*
 * A small client of raftlog's gRPC API (docs/api.md), as a Node.js team would write one with
 * @grpc/grpc-js and @grpc/proto-loader: the .proto files are loaded at run time (keepCase, so
 * fields keep their proto names), one channel per address, a deadline on every call.
 *
 * Errors come two ways (docs/api.md, "Errors"): per partition, as `error_code` in the response
 * (the call is OK), and for a call refused as a whole, as a gRPC status whose trailers carry the
 * Kafka error: `grpc-status-details-bin` (a google.rpc.Status with a google.rpc.ErrorInfo:
 * reason = Kafka's name, metadata kafka_error_code and retriable) and the plain
 * `raftlog-kafka-error-code`. Both become a KafkaError here. A failed call without those
 * trailers comes from gRPC itself (no connection, a deadline): retriable when UNAVAILABLE.
 */
const path = require('path')
const grpc = require('@grpc/grpc-js')
const protoLoader = require('@grpc/proto-loader')
const protobuf = require('protobufjs')

// The Kafka error codes this client meets by name; any other is shown by its number.
const KAFKA_ERRORS = {
  0: ['NONE', false],
  3: ['UNKNOWN_TOPIC_OR_PARTITION', true],
  5: ['LEADER_NOT_AVAILABLE', true],
  6: ['NOT_LEADER_OR_FOLLOWER', true],
  7: ['REQUEST_TIMED_OUT', true],
  13: ['NETWORK_EXCEPTION', true],
  19: ['NOT_ENOUGH_REPLICAS', true],
  20: ['NOT_ENOUGH_REPLICAS_AFTER_APPEND', true],
  36: ['TOPIC_ALREADY_EXISTS', false],
  41: ['NOT_CONTROLLER', true],
  74: ['FENCED_LEADER_EPOCH', true],
  75: ['UNKNOWN_LEADER_EPOCH', true],
}
const CALL_DEADLINE_MS = 15000 // above the produce's timeout_ms and the fetch's max_wait_ms

// google.rpc.Status and ErrorInfo (googleapis' google/rpc/status.proto, error_details.proto).
const RICH_ERROR_TYPES = protobuf.parse(`
  syntax = "proto3";
  package google.rpc;
  message Any { string type_url = 1; bytes value = 2; }
  message Status { int32 code = 1; string message = 2; repeated Any details = 3; }
  message ErrorInfo { string reason = 1; string domain = 2; map<string, string> metadata = 3; }
`).root
const RPC_STATUS = RICH_ERROR_TYPES.lookupType('google.rpc.Status')
const ERROR_INFO = RICH_ERROR_TYPES.lookupType('google.rpc.ErrorInfo')
const ERROR_INFO_URL = 'type.googleapis.com/google.rpc.ErrorInfo'

class KafkaError extends Error {
  /** `where`: the broker or controller that answered, `grpcCode`: the call's status, if any. */
  constructor(code, message, { retriable, name, where, grpcCode, leaderHint } = {}) {
    const [knownName, knownRetriable] = KAFKA_ERRORS[code] || [`KAFKA_ERROR_${code}`, false]
    super(message)
    this.code = code
    this.kafkaName = name || knownName
    this.retriable = retriable === undefined ? knownRetriable : retriable
    this.where = where
    this.grpcCode = grpcCode
    this.leaderHint = leaderHint
  }

  describe() {
    const via = this.grpcCode === undefined ? 'error_code' : `gRPC ${grpc.status[this.grpcCode]}`
    const kind = this.retriable ? 'retriable' : 'not retriable'
    return `${this.kafkaName} (${this.code}, ${kind}, ${via}): ${this.message}`
  }
}

/** The Kafka error a failed call's trailers carry (ErrorInfo first, then the plain key). */
function kafkaErrorOfStatus(error, where) {
  const [details] = error.metadata ? error.metadata.get('grpc-status-details-bin') : []
  if (details) {
    const status = RPC_STATUS.decode(details)
    for (const detail of status.details) {
      if (detail.type_url === ERROR_INFO_URL) {
        const info = ERROR_INFO.decode(detail.value)
        return new KafkaError(Number(info.metadata.kafka_error_code), status.message, {
          name: info.reason,
          retriable: info.metadata.retriable === 'true',
          where,
          grpcCode: error.code,
        })
      }
    }
  }
  const [plain] = error.metadata ? error.metadata.get('raftlog-kafka-error-code') : []
  if (plain !== undefined) {
    return new KafkaError(Number(plain), error.details, { where, grpcCode: error.code })
  }
  return null
}

/** The call's error as a KafkaError; gRPC's own failures (no trailers) keep their status. */
function asKafkaError(error, where) {
  if (error instanceof KafkaError || error.code === undefined) {
    return error
  }
  const kafkaError = kafkaErrorOfStatus(error, where)
  if (kafkaError) {
    return kafkaError
  }
  // No Kafka error: gRPC's own (connection refused or reset, deadline). The broker may be gone.
  return new KafkaError(-1, error.details, {
    name: `no Kafka error, gRPC ${grpc.status[error.code]}`,
    retriable: error.code === grpc.status.UNAVAILABLE,
    where,
    grpcCode: error.code,
  })
}

function loadApi(raftlogRoot) {
  const definition = protoLoader.loadSync(['protos/broker.proto', 'protos/controller.proto'], {
    includeDirs: [raftlogRoot],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
  })
  const api = grpc.loadPackageDefinition(definition).raftlog
  return { Broker: api.broker.v1.BrokerService, Controller: api.controller.v1.ControllerService }
}

class RaftlogClient {
  /** `bootstrap`: BROKER listeners, host:port; `raftlogRoot`: where protos/ is. */
  constructor(bootstrap, raftlogRoot = path.resolve(__dirname, '..', '..')) {
    this.api = loadApi(raftlogRoot)
    this.bootstrap = bootstrap
    this.stubs = new Map()
    this.brokers = new Map() // node id -> host:port, from the last Metadata
    this.controllers = []
    this.leaders = new Map() // "topic/partition" -> {leaderId, leaderEpoch}
  }

  stub(kind, address) {
    const key = `${kind} ${address}`
    if (!this.stubs.has(key)) {
      this.stubs.set(key, new this.api[kind](address, grpc.credentials.createInsecure()))
    }
    return this.stubs.get(key)
  }

  call(kind, address, method, request) {
    const deadline = new Date(Date.now() + CALL_DEADLINE_MS)
    return new Promise((resolve, reject) => {
      this.stub(kind, address)[method](request, { deadline }, (error, response) =>
        error ? reject(asKafkaError(error, address)) : resolve(response),
      )
    })
  }

  close() {
    for (const stub of this.stubs.values()) {
      stub.close()
    }
  }

  /** Metadata of `topics` from the first broker that answers (known brokers, then bootstrap). */
  async refreshMetadata(topics) {
    const errors = []
    for (const address of new Set([...this.brokers.values(), ...this.bootstrap])) {
      let response
      try {
        response = await this.call('Broker', address, 'Metadata', { topics })
      } catch (error) {
        errors.push(`${address}: ${error.message}`)
        continue
      }
      this.brokers = new Map(response.brokers.map(b => [b.node_id, `${b.host}:${b.port}`]))
      this.controllers = response.controller_addresses
      for (const topic of response.topics) {
        for (const p of topic.partitions) {
          const leader = { leaderId: p.leader_id, leaderEpoch: p.leader_epoch, error: p.error_code }
          this.leaders.set(`${topic.name}/${p.partition}`, leader)
        }
      }
      return { address, response }
    }
    throw new Error(`no broker answered Metadata: ${errors.join('; ')}`)
  }

  leader(topic, partition) {
    const leader = this.leaders.get(`${topic}/${partition}`)
    if (!leader || leader.leaderId < 0 || !this.brokers.has(leader.leaderId)) {
      return null
    }
    return { ...leader, address: this.brokers.get(leader.leaderId) }
  }

  /** CreateTopics on the active controller (following NOT_CONTROLLER's address). */
  async createTopic(name, numPartitions, replicationFactor) {
    const candidates = [...this.controllers]
    const tried = new Set()
    while (candidates.length > 0) {
      const address = candidates.shift()
      if (tried.has(address)) {
        continue
      }
      tried.add(address)
      const topic = { name, num_partitions: numPartitions, replication_factor: replicationFactor }
      let response
      try {
        response = await this.call('Controller', address, 'CreateTopics', { topics: [topic] })
      } catch (error) {
        if (error.retriable) {
          continue // this controller is down or busy: ask the next one
        }
        throw error
      }
      const status = response.status || { error_code: 0 }
      if (status.error_code === 41) {
        candidates.unshift(status.controller_address) // NOT_CONTROLLER: the active one's address
        continue
      }
      if (status.error_code !== 0) {
        throw new KafkaError(status.error_code, status.error_message, { where: address })
      }
      const [result] = response.topics
      if (result.error_code !== 0) {
        throw new KafkaError(result.error_code, result.error_message, { where: address })
      }
      return { controller: address, result }
    }
    throw new Error(`no controller of ${this.controllers.join(', ')} created ${name}`)
  }

  /** Produce one batch to `leader` with acks=all; the partition's outcome or a KafkaError. */
  async produce(leader, topic, partition, batch) {
    const response = await this.call('Broker', leader.address, 'Produce', {
      acks: -1,
      timeout_ms: 10000,
      topics: [{ name: topic, partitions: [{ partition, records: batch }] }],
    })
    const [answer] = response.topics[0].partitions
    if (answer.error_code !== 0) {
      const hint = answer.leader_id >= 0 ? answer.leader_id : undefined // KIP-951
      throw new KafkaError(answer.error_code, answer.error_message, {
        where: leader.address,
        leaderHint: hint,
      })
    }
    return answer
  }

  /** One Fetch from `offset` on `leader` (a consumer's, read_uncommitted, up to 1 MiB). */
  async fetch(leader, topic, partition, offset) {
    const response = await this.call('Broker', leader.address, 'Fetch', {
      replica_id: -1,
      max_wait_ms: 500,
      min_bytes: 1,
      max_bytes: 1 << 20,
      isolation_level: 0,
      topics: [
        {
          name: topic,
          partitions: [
            {
              partition,
              fetch_offset: String(offset),
              current_leader_epoch: leader.leaderEpoch,
              last_fetched_epoch: -1,
              partition_max_bytes: 1 << 20,
              log_start_offset: -1,
            },
          ],
        },
      ],
    })
    if (response.error_code !== 0) {
      throw new KafkaError(response.error_code, 'the fetch was refused', { where: leader.address })
    }
    const [answer] = response.topics[0].partitions
    if (answer.error_code !== 0) {
      throw new KafkaError(answer.error_code, answer.error_message, { where: leader.address })
    }
    return answer
  }
}

module.exports = { RaftlogClient, KafkaError, asKafkaError }
