package validate

import "testing"

// The estimate says how long, for how many bytes, and what it assumed.
func TestEstimate(t *testing.T) {
	tests := []struct {
		name              string
		device            Device
		jobs              int
		layers, proofOnly int64
		elemsPerByte      float64
		want              string
	}{
		{"CPU, bf16, 2 cores", DeviceCPU, 2, 4_840_000_000, 0, 0.5,
			"validate: estimate: about 20 s for 4.84 GB (an assumed 60 M weights/s a core on 2 cores)"},
		{"CPU, FP8: twice the weights a byte", DeviceCPU, 2, 4_840_000_000, 0, 1,
			"validate: estimate: about 40 s for 4.84 GB (an assumed 60 M weights/s a core on 2 cores)"},
		{"CPU, 4 cores, with the rest of DST", DeviceCPU, 4, 48_000_000_000, 2_000_000_000, 0.5,
			"validate: estimate: about 1m46s for 50.0 GB (an assumed 60 M weights/s a core on 4 cores)"},
		{"jobs unknown count as one core", DeviceCPU, 0, 1_200_000_000, 0, 2,
			"validate: estimate: about 40 s for 1.20 GB (an assumed 60 M weights/s a core on 1 core)"},
		{"the byte proof alone", DeviceCPU, 2, 0, 12_000_000_000, 0.5,
			"validate: estimate: about 40 s for 12.0 GB (byte proof at an assumed 300 MB/s)"},
		{"GPU", DeviceCUDA, 4, 1_380_000_000_000, 0, 1,
			"validate: estimate: about 11m30s for 1.38 TB (an assumed 2.00 GB/s on the GPU)"},
		{"a fixture", DeviceCPU, 2, 1_400_000, 0, 0.5,
			"validate: estimate: under a second for 1.40 MB (an assumed 60 M weights/s a core on 2 cores)"},
	}
	for _, tt := range tests {
		got := estimate(tt.device, tt.jobs, tt.layers, tt.proofOnly, tt.elemsPerByte)
		if got != tt.want {
			t.Errorf("%s:\n got %q\nwant %q", tt.name, got, tt.want)
		}
		if len(got) > 100 {
			t.Errorf("%s: %d columns", tt.name, len(got))
		}
	}
}
