import { NVML_LIBRARY } from '../defaults.js';
import { createPollingSource, type PollTarget } from '../polling-source.js';
import { gpuReading } from '../reading.js';
import type { GpuReading, GpuSource } from '../types.js';
import { loadNvml, type NvmlBinding, type NvmlDevice } from './binding.js';

export interface NvmlSourceOptions {
  pollMs: number;
  now: () => number;
  libraryPath?: string;
}

/**
 * GPU load straight from the driver through NVML. `start()` loads the library, runs
 * nvmlInit_v2 on koffi's worker pool (a cold driver can take seconds) and learns the devices
 * (count, handles, UUIDs: fixed for the life of an NVML session). Each poll then makes two
 * synchronous calls per GPU (utilization, memory) on the event loop. They are cheap, a few
 * microseconds each: the driver answers from counters it keeps, and holding NVML initialised
 * keeps the driver loaded even without persistence mode. An async call would cost more in
 * thread hand-off than the call itself. A failed call fails the whole reading (a snapshot
 * with a GPU missing would read as a smaller machine).
 */
export function createNvmlSource(options: NvmlSourceOptions): GpuSource {
  const libraryPath = options.libraryPath ?? NVML_LIBRARY;
  return createPollingSource({
    kind: 'nvml',
    pollMs: options.pollMs,
    now: options.now,
    open: () => openNvml(libraryPath),
  });
}

async function openNvml(libraryPath: string): Promise<PollTarget> {
  const nvml = await loadNvml(libraryPath);
  try {
    await nvml.init();
  } catch (error) {
    nvml.unload();
    throw error;
  }
  let devices: { index: number; handle: NvmlDevice; uuid: string }[];
  try {
    devices = listDevices(nvml);
  } catch (error) {
    close(nvml);
    throw error;
  }
  return {
    read: () => devices.map((device) => readDevice(nvml, device)),
    close: () => close(nvml),
  };
}

function listDevices(nvml: NvmlBinding) {
  const count = nvml.deviceCount();
  const devices = [];
  for (let index = 0; index < count; index++) {
    const handle = nvml.handleByIndex(index);
    devices.push({ index, handle, uuid: nvml.uuid(handle) });
  }
  return devices;
}

function readDevice(
  nvml: NvmlBinding,
  device: { index: number; handle: NvmlDevice; uuid: string },
): GpuReading {
  const utilizationPercent = nvml.utilizationPercent(device.handle);
  const memory = nvml.memory(device.handle);
  return gpuReading('nvml', {
    index: device.index,
    uuid: device.uuid,
    utilizationPercent,
    memoryUsed: memory.used,
    memoryTotal: memory.total,
  });
}

function close(nvml: NvmlBinding) {
  try {
    nvml.shutdown();
  } finally {
    nvml.unload();
  }
}
