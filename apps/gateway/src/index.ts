export { runGateway, startGateway, type Gateway } from './main.js';
