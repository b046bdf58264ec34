import { describe, expect, it } from 'vitest';
import {
  SSE_DONE,
  SSE_KEEPALIVE,
  openaiErrorBody,
  sseData,
  sseError,
  sseErrorEnd,
} from '../src/index.js';

describe('openaiErrorBody', () => {
  it('writes the OpenAI error shape, param null unless given', () => {
    expect(openaiErrorBody('model is required', 'invalid_request_error', null)).toBe(
      '{"error":{"message":"model is required","type":"invalid_request_error","param":null,"code":null}}',
    );
    expect(
      openaiErrorBody('no such model', 'invalid_request_error', 'model_not_found', 'model'),
    ).toBe(
      '{"error":{"message":"no such model","type":"invalid_request_error","param":"model","code":"model_not_found"}}',
    );
  });

  it('escapes whatever the message holds', () => {
    const message = 'bad "x" \\ \n\u2028 é';
    const body = openaiErrorBody(message, 't', 'c');
    expect(JSON.parse(body)).toStrictEqual({
      error: { message, type: 't', param: null, code: 'c' },
    });
    expect(body).not.toContain('\n');
  });
});

describe('SSE framing', () => {
  it('has the keep-alive comment and the end-of-stream event', () => {
    expect(SSE_KEEPALIVE).toBe(': keep-alive\n\n');
    expect(SSE_DONE).toBe('data: [DONE]\n\n');
  });

  it('frames one JSON payload as one event', () => {
    expect(sseData('{"id":"1","choices":[]}')).toBe('data: {"id":"1","choices":[]}\n\n');
  });

  it('splits a payload with line breaks into data lines, so the event cannot end early', () => {
    expect(sseData('{\n"a": 1,\r\n"b": 2\r}')).toBe(
      'data: {\ndata: "a": 1,\ndata: "b": 2\ndata: }\n\n',
    );
  });

  it('writes an in-band error event in the OpenAI shape', () => {
    const event = sseError('engine went away', 'server_error', 'engine_unavailable');
    expect(event).toBe(
      'data: {"error":{"message":"engine went away","type":"server_error","param":null,"code":"engine_unavailable"}}\n\n',
    );
    expect(JSON.parse(event.slice('data: '.length))).toHaveProperty(
      'error.code',
      'engine_unavailable',
    );
  });

  it('ends a failed stream as vLLM does: the error event, then [DONE]', () => {
    expect(sseErrorEnd('gone', 'server_error', 'engine_error')).toBe(
      `${sseError('gone', 'server_error', 'engine_error')}data: [DONE]\n\n`,
    );
  });
});
