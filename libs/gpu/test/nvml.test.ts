// The nvml source against a stand-in libnvidia-ml.so.1 compiled here from C, so koffi's
// calls, the struct layouts (including the 64-bit memory fields) and NVML's error codes
// are really exercised on a machine without a GPU.
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import koffi from 'koffi';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createGpuSource, GpuSourceError, NvmlError, type GpuSource } from '../src/index.ts';
import { GiB, record, tempDir } from './helpers.ts';

// Two devices with known values; memory above 4 GiB so a 32-bit read would show. Knobs,
// read from the environment on every call: FAKE_NVML_DEVICE_COUNT overrides the count,
// FAKE_NVML_FAIL_UTIL makes nvmlDeviceGetUtilizationRates return NVML_ERROR_UNKNOWN (999),
// FAKE_NVML_FAIL_INIT makes nvmlInit_v2 return NVML_ERROR_DRIVER_NOT_LOADED (9),
// FAKE_NVML_UTIL_NOT_SUPPORTED (device indexes, e.g. "1" or "01") makes those devices'
// nvmlDeviceGetUtilizationRates return NVML_ERROR_NOT_SUPPORTED (3), as a MIG-enabled GPU does.
const STAND_IN = String.raw`
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct { unsigned int gpu; unsigned int memory; } nvmlUtilization_t;
typedef struct { unsigned long long total; unsigned long long free; unsigned long long used; } nvmlMemory_t;
struct nvmlDevice_st { unsigned int index; };
typedef struct nvmlDevice_st *nvmlDevice_t;

#define GIB (1024ULL * 1024ULL * 1024ULL)
static struct nvmlDevice_st devices[2] = {{0}, {1}};
static const unsigned int util[2] = {37, 91};
static const unsigned long long total[2] = {80 * GIB, 141 * GIB};
static const unsigned long long used[2] = {20 * GIB, 130 * GIB};
static const char *uuids[2] = {"GPU-2f1c5a3e-8d7b-4c1a-9e0f-5a6b7c8d0037",
                               "GPU-9b4e7d21-3c6a-4f58-b1d2-0e1f2a3b0091"};
static int initialized = 0;

static int flag(const char *name) {
  const char *v = getenv(name);
  return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}
static unsigned int count(void) {
  const char *v = getenv("FAKE_NVML_DEVICE_COUNT");
  return v != NULL && v[0] != '\0' ? (unsigned int)atoi(v) : 2;
}
static int not_supported(unsigned int index) {
  const char *v = getenv("FAKE_NVML_UTIL_NOT_SUPPORTED");
  return v != NULL && strchr(v, '0' + (int)index) != NULL;
}
static int valid(nvmlDevice_t d) { return d == &devices[0] || d == &devices[1]; }

/* For the test: how many nvmlInit_v2 calls are not yet matched by nvmlShutdown. */
int fake_nvml_initialized(void) { return initialized; }

nvmlReturn_t nvmlInit_v2(void) {
  if (flag("FAKE_NVML_FAIL_INIT")) return 9;
  initialized++;
  return 0;
}
nvmlReturn_t nvmlShutdown(void) {
  if (initialized == 0) return 1;
  initialized--;
  return 0;
}
const char *nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    default: return "Unknown Error";
  }
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
  if (!initialized) return 1;
  if (deviceCount == NULL) return 2;
  *deviceCount = count();
  return 0;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
  if (!initialized) return 1;
  if (device == NULL || index >= count() || index >= 2) return 2;
  *device = &devices[index];
  return 0;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
  if (!initialized) return 1;
  if (!valid(device) || utilization == NULL) return 2;
  if (flag("FAKE_NVML_FAIL_UTIL")) return 999;
  if (not_supported(device->index)) return 3;
  utilization->gpu = util[device->index];
  utilization->memory = util[device->index] / 2;
  return 0;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
  if (!initialized) return 1;
  if (!valid(device) || memory == NULL) return 2;
  memory->total = total[device->index];
  memory->used = used[device->index];
  memory->free = total[device->index] - used[device->index];
  return 0;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
  if (!initialized) return 1;
  if (!valid(device) || uuid == NULL) return 2;
  if (length < strlen(uuids[device->index]) + 1) return 7;
  snprintf(uuid, length, "%s", uuids[device->index]);
  return 0;
}
`;

const KNOBS = [
  'FAKE_NVML_DEVICE_COUNT',
  'FAKE_NVML_FAIL_UTIL',
  'FAKE_NVML_FAIL_INIT',
  'FAKE_NVML_UTIL_NOT_SUPPORTED',
];

describe('GPU_SOURCE=nvml (stand-in libnvidia-ml.so.1 built from C)', () => {
  const dir = tempDir('nvml');
  const libraryPath = join(dir.path, 'libnvidia-ml.so.1');
  let initialized: () => number;
  let source: GpuSource | undefined;
  let clock = 1_700_000_000_000;
  const now = () => clock;

  beforeAll(() => {
    const src = join(dir.path, 'nvml-stand-in.c');
    writeFileSync(src, STAND_IN);
    execFileSync('gcc', ['-shared', '-fPIC', '-Wall', '-Werror', '-o', libraryPath, src]);
    // The test's own handle on the same library (dlopen shares one copy, and its state).
    initialized = koffi.load(libraryPath).func('fake_nvml_initialized', 'int', []);
  });

  afterEach(async () => {
    await source?.stop();
    source = undefined;
    for (const knob of KNOBS) delete process.env[knob];
  });

  afterAll(() => dir.remove());

  function nvml(pollMs = 20) {
    source = createGpuSource({ source: 'nvml', libraryPath, pollMs, now })!;
    return source;
  }

  it('reads utilization, 64-bit memory and UUIDs of every device on start', async () => {
    const gpu = nvml();
    expect(gpu.kind).toBe('nvml');
    expect(gpu.latest()).toBeUndefined();
    await gpu.start();
    expect(gpu.latest()).toEqual({
      at: clock,
      gpus: [
        {
          index: 0,
          uuid: 'GPU-2f1c5a3e-8d7b-4c1a-9e0f-5a6b7c8d0037',
          utilization: 0.37,
          memoryUsed: 20 * GiB,
          memoryTotal: 80 * GiB,
        },
        {
          index: 1,
          uuid: 'GPU-9b4e7d21-3c6a-4f58-b1d2-0e1f2a3b0091',
          utilization: 0.91,
          memoryUsed: 130 * GiB,
          memoryTotal: 141 * GiB,
        },
      ],
    });
    expect(initialized()).toBe(1);
  });

  it('polls on its timer, emitting a snapshot stamped by the injected clock each time', async () => {
    const gpu = nvml();
    const events = record(gpu);
    await gpu.start();
    clock += 20;
    const next = await events.nextSnapshot();
    expect(next.at).toBe(clock);
    expect(next.gpus.map((g) => g.memoryTotal)).toEqual([80 * GiB, 141 * GiB]);
    expect(events.snapshots.length).toBeGreaterThanOrEqual(2);
    expect(events.errors).toEqual([]);
  });

  it('sees as many devices as nvmlDeviceGetCount_v2 reports', async () => {
    process.env.FAKE_NVML_DEVICE_COUNT = '1';
    const gpu = nvml();
    await gpu.start();
    expect(gpu.latest()!.gpus.map((g) => g.index)).toEqual([0]);
  });

  it('maps a failing call to an error naming the function and nvmlErrorString, keeps the last snapshot and keeps trying', async () => {
    const gpu = nvml();
    const events = record(gpu);
    await gpu.start();
    const good = gpu.latest()!;

    process.env.FAKE_NVML_FAIL_UTIL = '1';
    const error = await events.nextError();
    expect(error).toBeInstanceOf(NvmlError);
    expect(error).toMatchObject({
      code: 'ERR_GPU_NVML',
      function: 'nvmlDeviceGetUtilizationRates',
      nvmlReturn: 999,
      message:
        'GPU_SOURCE=nvml: nvmlDeviceGetUtilizationRates failed: Unknown Error (nvmlReturn_t 999)',
    });
    expect(gpu.latest()).toBe(good);

    await events.nextError(); // still polling while it fails
    expect(gpu.latest()).toBe(good);

    delete process.env.FAKE_NVML_FAIL_UTIL;
    clock += 1000;
    const recovered = await events.nextSnapshot();
    expect(recovered.at).toBe(clock);
    expect(recovered.gpus.map((g) => g.utilization)).toEqual([0.37, 0.91]);
  });

  it('leaves out a GPU whose utilization is Not Supported (MIG), says so once, and reads the others', async () => {
    process.env.FAKE_NVML_UTIL_NOT_SUPPORTED = '1';
    const gpu = nvml();
    const events = record(gpu);
    await gpu.start();
    expect(gpu.latest()!.gpus.map((g) => [g.index, g.utilization])).toEqual([[0, 0.37]]);
    expect(events.warnings).toHaveLength(1);
    expect(events.warnings[0]).toMatchObject({
      code: 'ERR_GPU_UNSUPPORTED',
      message:
        'GPU_SOURCE=nvml: GPU 1 (GPU-9b4e7d21-3c6a-4f58-b1d2-0e1f2a3b0091) is left out of every reading: nvmlDeviceGetUtilizationRates answers Not Supported (nvmlReturn_t 3), as on a MIG-enabled GPU',
    });

    for (let i = 0; i < 3; i++) {
      clock += 20;
      const next = await events.nextSnapshot();
      expect(next.gpus.map((g) => g.index)).toEqual([0]);
    }
    expect(events.warnings).toHaveLength(1);
    expect(events.errors).toEqual([]);

    // Any other failure still fails the reading.
    process.env.FAKE_NVML_FAIL_UTIL = '1';
    expect(await events.nextError()).toMatchObject({ nvmlReturn: 999 });
    expect(events.warnings).toHaveLength(1);
  });

  it('reads no GPU when every GPU answers Not Supported, and says so once', async () => {
    process.env.FAKE_NVML_UTIL_NOT_SUPPORTED = '01';
    const gpu = nvml();
    const events = record(gpu);
    await gpu.start();
    expect(gpu.latest()).toEqual({ at: clock, gpus: [] });
    expect(events.warnings.map((w) => w.message)).toEqual([
      expect.stringContaining('GPU 0 (GPU-2f1c5a3e-8d7b-4c1a-9e0f-5a6b7c8d0037) is left out'),
      expect.stringContaining('GPU 1 (GPU-9b4e7d21-3c6a-4f58-b1d2-0e1f2a3b0091) is left out'),
      'GPU_SOURCE=nvml: no GPU is left to read (each one answers Not Supported); readings carry no GPU, the dispatcher runs without GPU input',
    ]);

    for (let i = 0; i < 3; i++) {
      clock += 20;
      expect((await events.nextSnapshot()).gpus).toEqual([]);
    }
    expect(events.warnings).toHaveLength(3);
    expect(events.errors).toEqual([]);
  });

  it('shuts NVML down on stop and emits nothing afterwards', async () => {
    const gpu = nvml();
    const events = record(gpu);
    await gpu.start();
    expect(initialized()).toBe(1);
    await gpu.stop();
    expect(initialized()).toBe(0);
    const count = events.snapshots.length;
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(events.snapshots.length).toBe(count);
  });

  it('rejects start when nvmlInit_v2 fails, with the NVML reason', async () => {
    process.env.FAKE_NVML_FAIL_INIT = '1';
    await expect(nvml().start()).rejects.toMatchObject({
      code: 'ERR_GPU_NVML',
      function: 'nvmlInit_v2',
      message: 'GPU_SOURCE=nvml: nvmlInit_v2 failed: Driver Not Loaded (nvmlReturn_t 9)',
    });
    expect(initialized()).toBe(0);
  });

  it('rejects start when a device cannot be opened, and shuts NVML down again', async () => {
    process.env.FAKE_NVML_DEVICE_COUNT = '3';
    await expect(nvml().start()).rejects.toMatchObject({
      code: 'ERR_GPU_NVML',
      function: 'nvmlDeviceGetHandleByIndex_v2',
      message:
        'GPU_SOURCE=nvml: nvmlDeviceGetHandleByIndex_v2 failed: Invalid Argument (nvmlReturn_t 2)',
    });
    expect(initialized()).toBe(0);
  });

  it('rejects start with one clear line when the library is absent', async () => {
    const missing = join(dir.path, 'absent', 'libnvidia-ml.so.1');
    source = createGpuSource({ source: 'nvml', libraryPath: missing })!;
    const error = await source.start().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(GpuSourceError);
    expect((error as GpuSourceError).code).toBe('ERR_GPU_LIBRARY');
    const message = (error as Error).message;
    expect(message).not.toContain('\n');
    expect(message).toMatch(
      new RegExp(
        `^GPU_SOURCE=nvml: cannot load ${missing.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} \\(.*No such file or directory.*\\); the dispatcher runs without GPU input$`,
      ),
    );
    expect(source.latest()).toBeUndefined();
  });

  it('rejects start with one clear line when the library is not NVML', async () => {
    source = createGpuSource({ source: 'nvml', libraryPath: 'libc.so.6' })!;
    await expect(source.start()).rejects.toMatchObject({
      code: 'ERR_GPU_LIBRARY',
      message: expect.stringMatching(
        /^GPU_SOURCE=nvml: libc\.so\.6 is not a usable NVML \(.*nvmlInit_v2.*\); the dispatcher runs without GPU input$/,
      ),
    });
  });
});
