export { runEngineSim } from './main.js';
export { createEngineSim, type EngineSim } from './server.js';
export { parseSimOptions, simHelp, SimConfigError, type SimOptions } from './options.js';
export { profiles, profileNames, type EngineProfile, type ProfileName } from './profiles.js';
export { Scheduler, Sequence, type SchedulerConfig, type Step } from './scheduler.js';
export type { Faults } from './faults.js';
