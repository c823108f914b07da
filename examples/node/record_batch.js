'use strict'
/*
 * Kafka's RecordBatch v2 (magic 2), the bytes of ProduceRequest's and FetchResponse's `records`,
 * written and read here with no IO: what a client library does before and after a call.
 *
 * Batch header (61 bytes, big-endian), then the records:
 *
 *   baseOffset int64 | batchLength int32 (bytes after this field) | partitionLeaderEpoch int32 |
 *   magic int8 (2) | crc uint32 | attributes int16 | lastOffsetDelta int32 |
 *   baseTimestamp int64 | maxTimestamp int64 | producerId int64 | producerEpoch int16 |
 *   baseSequence int32 | recordCount int32
 *
 * The CRC is CRC-32C (Castagnoli) over everything after it, from attributes to the last record
 * (the npm package crc-32's `crc32c`, pure JS). A record is
 *
 *   length varint | attributes int8 | timestampDelta varlong | offsetDelta varint |
 *   keyLength varint (-1 = null) | key | valueLength varint (-1 = null) | value |
 *   headerCount varint | (keyLength varint, key utf-8, valueLength varint (-1 = null), value)*
 *
 * with zigzag base-128 varints as Kafka's ByteUtils. Encoding writes an uncompressed batch of a
 * plain (non-idempotent) producer: producer id -1, epoch -1, sequence -1; the broker assigns the
 * offsets (baseOffset 0 on the wire). Decoding reads uncompressed batches, checks magic and CRC,
 * and skips control batches (transaction markers).
 */
const CRC32C = require('crc-32/crc32c')

const MAGIC = 2
const HEADER_BYTES = 61
const LOG_OVERHEAD = 12 // baseOffset + batchLength: the bytes batchLength does not count
const CRC_OFFSET = 17
const ATTRIBUTES_OFFSET = 21
const COMPRESSION_MASK = 0x07
const CONTROL_MASK = 0x20
const MAX_VARINT_BYTES = 5
const MAX_VARLONG_BYTES = 10
const MASK_64 = (1n << 64n) - 1n

/** Zigzag base-128 of a signed 64-bit value (BigInt), as bytes. */
function varlong(value) {
  let zigzag = ((BigInt(value) << 1n) ^ (BigInt(value) >> 63n)) & MASK_64
  const bytes = []
  while (zigzag >= 0x80n) {
    bytes.push(Number((zigzag & 0x7fn) | 0x80n))
    zigzag >>= 7n
  }
  bytes.push(Number(zigzag))
  return Buffer.from(bytes)
}

/** Zigzag base-128 of a signed 32-bit int. */
function varint(value) {
  if (!Number.isInteger(value) || value < -(2 ** 31) || value >= 2 ** 31) {
    throw new RangeError(`varint out of the int32 range: ${value}`)
  }
  return varlong(value)
}

/** Read a zigzag varint (at most `maxBytes` bytes) at `position`: [value as BigInt, next]. */
function readVarlong(buffer, position, maxBytes = MAX_VARLONG_BYTES) {
  let raw = 0n
  for (let i = 0; i < maxBytes; i++) {
    if (position + i >= buffer.length) {
      throw new Error('a varint runs past the end of the batch')
    }
    const byte = buffer[position + i]
    raw |= BigInt(byte & 0x7f) << BigInt(7 * i)
    if ((byte & 0x80) === 0) {
      return [(raw >> 1n) ^ -(raw & 1n), position + i + 1]
    }
  }
  throw new Error(`a varint longer than ${maxBytes} bytes`)
}

function readVarint(buffer, position) {
  const [value, next] = readVarlong(buffer, position, MAX_VARINT_BYTES)
  return [Number(value), next]
}

/** A nullable byte field: its varint length (-1 = null), then the bytes. */
function nullableBytes(value) {
  if (value === null || value === undefined) {
    return varint(-1)
  }
  const bytes = Buffer.isBuffer(value) ? value : Buffer.from(String(value), 'utf8')
  return Buffer.concat([varint(bytes.length), bytes])
}

function encodeRecord(record, offsetDelta, baseTimestampMs) {
  const headers = record.headers || []
  const body = Buffer.concat([
    Buffer.from([0]), // attributes: unused
    varlong(BigInt(record.timestampMs) - BigInt(baseTimestampMs)),
    varint(offsetDelta),
    nullableBytes(record.key),
    nullableBytes(record.value),
    varint(headers.length),
    ...headers.flatMap(([key, value]) => [nullableBytes(key), nullableBytes(value)]),
  ])
  return Buffer.concat([varint(body.length), body])
}

/**
 * One uncompressed RecordBatch v2 of `records`: [{key, value, timestampMs, headers}], key and
 * value strings, Buffers or null, headers [[name, value], ...]. The broker assigns the offsets.
 */
function encodeBatch(records) {
  if (records.length === 0) {
    throw new RangeError('a batch holds at least one record')
  }
  const timestamps = records.map(r => BigInt(r.timestampMs))
  const baseTimestampMs = timestamps.reduce((a, b) => (a < b ? a : b))
  const maxTimestampMs = timestamps.reduce((a, b) => (a > b ? a : b))
  const body = Buffer.concat(records.map((r, i) => encodeRecord(r, i, baseTimestampMs)))
  const batch = Buffer.alloc(HEADER_BYTES + body.length)
  batch.writeBigInt64BE(0n, 0) // baseOffset: the broker's to assign
  batch.writeInt32BE(batch.length - LOG_OVERHEAD, 8) // batchLength
  batch.writeInt32BE(-1, 12) // partitionLeaderEpoch: the leader stamps it
  batch.writeInt8(MAGIC, 16)
  batch.writeInt16BE(0, ATTRIBUTES_OFFSET) // no compression, CreateTime, not transactional
  batch.writeInt32BE(records.length - 1, 23) // lastOffsetDelta
  batch.writeBigInt64BE(baseTimestampMs, 27)
  batch.writeBigInt64BE(maxTimestampMs, 35)
  batch.writeBigInt64BE(-1n, 43) // producerId: none (not idempotent)
  batch.writeInt16BE(-1, 51) // producerEpoch
  batch.writeInt32BE(-1, 53) // baseSequence
  batch.writeInt32BE(records.length, 57)
  body.copy(batch, HEADER_BYTES)
  batch.writeUInt32BE(CRC32C.buf(batch.subarray(ATTRIBUTES_OFFSET)) >>> 0, CRC_OFFSET)
  return batch
}

function readNullable(buffer, position) {
  const [length, next] = readVarint(buffer, position)
  if (length < 0) {
    return [null, next]
  }
  if (next + length > buffer.length) {
    throw new Error('a record field runs past the end of the batch')
  }
  return [buffer.subarray(next, next + length), next + length]
}

function decodeRecord(buffer, position, baseOffset, baseTimestampMs) {
  const [length, start] = readVarint(buffer, position)
  const end = start + length
  let at = start + 1 // attributes
  let timestampDelta
  let offsetDelta
  let key
  let value
  let headerCount
  ;[timestampDelta, at] = readVarlong(buffer, at)
  ;[offsetDelta, at] = readVarint(buffer, at)
  ;[key, at] = readNullable(buffer, at)
  ;[value, at] = readNullable(buffer, at)
  ;[headerCount, at] = readVarint(buffer, at)
  const headers = []
  for (let i = 0; i < headerCount; i++) {
    let name
    let headerValue
    ;[name, at] = readNullable(buffer, at)
    ;[headerValue, at] = readNullable(buffer, at)
    headers.push([name === null ? null : name.toString('utf8'), headerValue])
  }
  if (at !== end) {
    throw new Error(`a record's length says ${length} bytes, its fields take ${at - start}`)
  }
  const record = {
    offset: baseOffset + BigInt(offsetDelta),
    timestampMs: baseTimestampMs + timestampDelta,
    key,
    value,
    headers,
  }
  return [record, end]
}

/**
 * The records of every whole batch in `buffer` (a fetch answers whole batches back to back),
 * each {offset (BigInt), timestampMs (BigInt), key, value (Buffers or null), headers}. Throws on
 * a batch whose magic or CRC is wrong; refuses compressed batches (this example writes none).
 */
function decodeBatches(buffer) {
  const records = []
  let position = 0
  while (position + HEADER_BYTES <= buffer.length) {
    const batchEnd = position + LOG_OVERHEAD + buffer.readInt32BE(position + 8)
    if (batchEnd > buffer.length) {
      break // a partial batch at the end: the next fetch reads it whole
    }
    const batch = buffer.subarray(position, batchEnd)
    const baseOffset = batch.readBigInt64BE(0)
    if (batch.readInt8(16) !== MAGIC) {
      throw new Error(`batch at offset ${baseOffset}: magic ${batch.readInt8(16)}, not 2`)
    }
    const crc = CRC32C.buf(batch.subarray(ATTRIBUTES_OFFSET)) >>> 0
    if (crc !== batch.readUInt32BE(CRC_OFFSET)) {
      throw new Error(`batch at offset ${baseOffset}: CRC-32C mismatch (CORRUPT_MESSAGE)`)
    }
    const attributes = batch.readInt16BE(ATTRIBUTES_OFFSET)
    if ((attributes & COMPRESSION_MASK) !== 0) {
      throw new Error(`batch at offset ${baseOffset}: compressed (codec ${attributes & 7})`)
    }
    if ((attributes & CONTROL_MASK) === 0) {
      const baseTimestampMs = batch.readBigInt64BE(27)
      let at = HEADER_BYTES
      for (let i = 0, count = batch.readInt32BE(57); i < count; i++) {
        let record
        ;[record, at] = decodeRecord(batch, at, baseOffset, baseTimestampMs)
        records.push(record)
      }
    }
    position = batchEnd
  }
  return records
}

module.exports = { encodeBatch, decodeBatches, varint, varlong, readVarlong }
