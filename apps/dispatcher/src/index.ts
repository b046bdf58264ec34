export { runDispatcher, startDispatcher, type Dispatcher } from './main.js';
