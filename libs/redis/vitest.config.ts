// `dir` pins the test scan to this project, also when vitest is run from the repository root.
import { fileURLToPath } from 'node:url';
import { mergeConfig } from 'vitest/config';
import shared from '../../vitest.shared.ts';

export default mergeConfig(shared, {
  test: { dir: fileURLToPath(new URL('.', import.meta.url)) },
});
