package main

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// redisCPU is the CPU time (user plus system, main thread and children)
// redis-server reports in INFO cpu.
func redisCPU(ctx context.Context, rdb *redis.Client) float64 {
	s, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0
	}
	var sum float64
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, _ := strconv.ParseFloat(v, 64)
			sum += f
		}
	}
	return sum
}

// redisNice is the scheduling priority of the redis-server that steps 1,
// 2 and 7 share. Those steps run a dozen gateway and load generator
// processes on the machine's few cores; at the same priority as each of
// them, Redis's one thread gets a dozenth of the CPU, and every renewal
// queues behind the others' time slices, where in production Redis has
// cores of its own. Taking this priority needs root; without it the
// server runs at the default, and the report says which it had.
const redisNice = -10

// redisProcessNice is the priority redis-server runs at, read from
// /proc by the process id it reports; 0 when unknown.
func redisProcessNice(ctx context.Context, rdb *redis.Client) int {
	s, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == "process_id" {
			return processNice(v)
		}
	}
	return 0
}
