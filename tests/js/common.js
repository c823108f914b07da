'use strict'
/*
 * What every kafkajs scenario shares (tests/dataplane/kafka/test_kafkajs.py runs them with
 * `node`): the client built from RAFTLOG_KAFKA_BOOTSTRAP (the cluster's KAFKA listeners, comma
 * separated), kafkajs's own log on stderr (stdout carries only the result), bounded waits, and
 * `main`, which prints the scenario's result as one JSON line and exits 0, or prints
 * {"error": ...} and exits 1. The scenarios report what kafkajs saw; the Python test judges it
 * against what raftlog stores.
 */
const { Kafka, Partitioners, logLevel } = require('kafkajs')

// A consumer group of kafkajs members forms within a second or two with these (kafkajs's
// defaults, a 30 s session and 60 s rebalance, make a member that leaves cost half a minute).
const GROUP_TIMEOUTS = {
  sessionTimeout: 6000, // group.min.session.timeout.ms, Kafka's default floor
  rebalanceTimeout: 10000,
  heartbeatInterval: 500,
  maxWaitTimeInMs: 200,
}

function stderrLogger() {
  return ({ namespace, level, label, log }) => {
    const { message, ...extra } = log
    process.stderr.write(`${label} [${namespace}] ${message} ${JSON.stringify(extra)}\n`)
  }
}

function kafka(clientId) {
  const brokers = (process.env.RAFTLOG_KAFKA_BOOTSTRAP || '').split(',').filter(Boolean)
  if (brokers.length === 0) {
    throw new Error('RAFTLOG_KAFKA_BOOTSTRAP names no broker')
  }
  return new Kafka({
    clientId,
    brokers,
    logLevel: logLevel.WARN,
    logCreator: stderrLogger,
    connectionTimeout: 10000,
    requestTimeout: 30000,
  })
}

/** A producer with kafkajs 2's default partitioner (Java's murmur2), named so it does not warn. */
function producer(client, options = {}) {
  return client.producer({ createPartitioner: Partitioners.DefaultPartitioner, ...options })
}

/** Poll `condition` every 50 ms until it holds; fail naming `what` after `timeoutMs`. */
async function waitFor(what, condition, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const value = await condition()
    if (value) {
      return value
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
    }
    await new Promise(resolve => setTimeout(resolve, 50))
  }
}

function check(condition, message) {
  if (!condition) {
    throw new Error(message)
  }
}

/** Run the scenario, print its one result line and exit (kafkajs keeps sockets otherwise). */
function main(scenario) {
  scenario().then(
    result => {
      process.stdout.write(`${JSON.stringify(result)}\n`)
      process.exit(0)
    },
    error => {
      process.stderr.write(`${error.stack || error}\n`)
      process.stdout.write(`${JSON.stringify({ error: String(error.message || error) })}\n`)
      process.exit(1)
    }
  )
}

module.exports = { GROUP_TIMEOUTS, check, kafka, main, producer, waitFor }
