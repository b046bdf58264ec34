// One lint setup for the whole tree. Type-aware rules are left out on purpose:
// `npm run typecheck` already runs the compiler over sources and tests.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

const noFocusedOrSkippedTests = [
  {
    selector: "CallExpression[callee.property.name='only']",
    message: 'No focused tests on main.',
  },
  {
    selector: "CallExpression[callee.property.name='skip']",
    message: 'No skipped tests on main.',
  },
];

export default tseslint.config(
  { ignores: ['**/dist/**', '**/node_modules/**', '.nx/**', 'bench/results/**'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: {
      globals: { process: 'readonly', console: 'readonly', URL: 'readonly' },
    },
    rules: {
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_' },
      ],
      'no-restricted-syntax': ['error', ...noFocusedOrSkippedTests],
    },
  },
  {
    // Sources only: a getter or setter in an object literal made per request is a measured
    // cost (docs/performance.md, "An accessor in a literal"); use a class.
    files: ['apps/*/src/**/*.ts', 'libs/*/src/**/*.ts'],
    rules: {
      'no-restricted-syntax': [
        'error',
        ...noFocusedOrSkippedTests,
        {
          selector:
            "ObjectExpression > Property[kind='get'], ObjectExpression > Property[kind='set']",
          message:
            'An accessor in an object literal: V8 allocates its accessor pair in the old generation each time, which keeps the closure and its context through young collections. Use a class (its accessors live on the prototype).',
        },
      ],
    },
  },
);
