package cli

import "testing"

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want Size
		bad  bool
	}{
		{in: "4096", want: 4096},
		{in: "64KiB", want: 64 << 10},
		{in: "512MiB", want: 512 << 20},
		{in: "512mib", want: 512 << 20},
		{in: "2G", want: 2 << 30},
		{in: " 1.5GiB ", want: 3 << 29},
		{in: "1MB", want: 1000 * 1000},
		{in: "0", want: 0},
		{in: "16777216TiB", bad: true},
		{in: "", bad: true},
		{in: "MiB", bad: true},
		{in: "-1", bad: true},
		{in: "12 parsecs", bad: true},
		{in: "NaN", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSize(tt.in)
			if tt.bad {
				if err == nil {
					t.Fatalf("ParseSize(%q) = %d, want an error", tt.in, got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestSizeString(t *testing.T) {
	for _, tt := range []struct {
		in   Size
		want string
	}{
		{0, "0B"}, {1023, "1023B"}, {4096, "4KiB"}, {512 << 20, "512MiB"},
		{3 << 29, "1.50GiB"}, {1536, "1.50KiB"}, {64 << 30, "64GiB"},
	} {
		if got := tt.in.String(); got != tt.want {
			t.Errorf("Size(%d).String() = %q, want %q", uint64(tt.in), got, tt.want)
		}
		if back, err := ParseSize(tt.in.String()); err != nil || (back != tt.in && tt.in%1024 == 0) {
			t.Errorf("round trip of %d: %d, %v", uint64(tt.in), back, err)
		}
	}
}
