# Plots of the amplification experiment (gnuplot-nox). Run from the directory holding the data
# files written by `bench_amplification --out_dir=DIR`:
#   cd DIR && gnuplot /path/to/bench/plots.gp
# Writes amplification_outage.png, amplification_by_regime.png and, when the fleet-size sweep
# ran (amplification_fleet_sweep.dat), amplification_fleet_size.png.
set terminal pngcairo size 800,420 font ",10"
set key top right
set grid

set output "amplification_outage.png"
set title "Retries per second when the backend goes down (t = 0), 4 workers x 4 call sites"
set xlabel "seconds since the outage started"
set ylabel "retries / s (100 ms buckets)"
set logscale y
set yrange [0.5:*]
plot "amplification_timeseries.dat" using 1:($2+0.5) with steps lw 2 title "per-call cap (4 attempts)", \
     "" using 1:($3+0.5) with steps lw 2 title "per-process throttle (gRPC retryThrottling)", \
     "" using 1:($4+0.5) with steps lw 2 title "fleet-wide budget (this project)"
unset logscale y

set output "amplification_by_regime.png"
set title "Backend load amplification (attempts per logical call; outage: during the outage)"
set xlabel ""
set ylabel "attempts / logical call"
set yrange [0:*]
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
plot "amplification_table.dat" using 2:xtic(1) title "per-call cap", \
     "" using 3 title "per-process throttle", \
     "" using 4 title "fleet budget"

# The fleet-size sweep: retries into the dead backend during the outage against the number of
# worker processes N (same fleet-wide call rate at every N). Columns of the data file: N, outage
# retries (per-call cap, throttle, fleet budget), the same in the outage's first second, then
# degraded-regime retries; only the first group is plotted (the first second holds almost all
# of the outage's retries for the throttle and the budget, so those lines would lie on top).
if (system("test -s amplification_fleet_sweep.dat && echo 1 || echo 0") + 0 == 1) {
  set output "amplification_fleet_size.png"
  set title "Retries into a dead backend vs fleet size (same total call rate at every N)"
  set xlabel "worker processes N"
  set ylabel "retries during the outage"
  set style data linespoints
  set logscale x 2
  set logscale y
  set xrange [*:*]
  set yrange [*:*]
  set format y "%g"
  set key bottom right
  plot "amplification_fleet_sweep.dat" using 1:2:xtic(1) lw 2 pt 7 title "per-call cap (4 attempts)", \
       "" using 1:3 lw 2 pt 7 title "per-process throttle (gRPC retryThrottling)", \
       "" using 1:4 lw 2 pt 7 title "fleet-wide budget (this project)"
}
