// A grpc-js proxy for RetryBudgetService.Sync on 127.0.0.1:0 that forwards every request to
// the real server and, on demand, loses the response (the server applied the request; the
// client gets UNAVAILABLE), or holds the responses until the test lets them go. It records every
// request it saw. As tests/python/sync_proxy.py.

import { budgetServices, grpc } from '../../client/js/src/index.js';

export class SyncProxy {
  static async start(upstream) {
    const p = new SyncProxy(upstream);
    await new Promise((resolve, reject) => p.server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (error, port) => {
      if (error) reject(error);
      else {
        p.port = port;
        resolve();
      }
    }));
    return p;
  }

  constructor(upstream) {
    const { RetryBudgetService } = budgetServices();
    this.upstream = new RetryBudgetService(upstream, grpc.credentials.createInsecure());
    this.requests = []; // every SyncRequest received, in order
    this.dropNext = 0; // lose the responses of this many next (non-final) requests
    this.dropAll = false; // lose every non-final response
    this.dropped = []; // the requests whose response was lost
    this.hold = null; // a Promise: responses are passed on once it settles (null: at once)
    this.server = new grpc.Server();
    this.server.addService(RetryBudgetService.service, {
      Sync: (call, callback) => {
        const request = call.request;
        this.requests.push(structuredClone(request));
        const drop = !request.final && (this.dropAll || this.dropNext > 0);
        if (drop && !this.dropAll) this.dropNext--;
        if (drop) this.dropped.push(structuredClone(request));
        const hold = this.hold;
        this.upstream.Sync(request, { deadline: new Date(Date.now() + 5000) }, (error, response) => {
          const answer = () => {
            if (error) callback(error);
            else if (drop) callback({ code: grpc.status.UNAVAILABLE, details: 'response lost by the test proxy' });
            else callback(null, response);
          };
          if (hold === null) answer();
          else hold.then(answer, answer);
        });
      },
    });
  }

  get target() {
    return `127.0.0.1:${this.port}`;
  }

  stop() {
    this.server.forceShutdown();
    this.upstream.close();
  }
}
