// Type declarations of @retry-budget/client/testing (not for production use).
import type { ChannelCredentials } from '@grpc/grpc-js';
import type { TenantBudget } from './index.js';

export class ServerProcess {
  constructor(binary: string, directory: string, args?: string[]);
  readonly binary: string;
  readonly directory: string;
  args: string[];
  port: number;
  readonly target: string;
  start(): Promise<this>;
  kill(): Promise<void>;
  restart(): Promise<void>;
  output(): string;
}

export class AdminClient {
  constructor(target: string, credentials?: ChannelCredentials, channelOptions?: Record<string, unknown>);
  getBudget(tenant: string): Promise<Record<string, any>>;
  putPolicy(tenant: string, policy: Record<string, number>): Promise<Record<string, any>>;
  close(): void;
}

export function localBudget(tokens: number, name?: string): Promise<TenantBudget>;
